"""Conformance examples per second over 20 device orders of one program, with and without
refsim's trace reuse (`refsim.interpreter.trace_cache`).

One example is: refsim runs the program on a 2x4 mesh in one device order, XLA (through
xla_backend, on the 8 CPU devices) runs it on the same mesh, and `conformance.compare`
checks every device's shard. The XLA side compiles once per mesh either way (jax.jit's
cache is keyed by devices); refsim either traces once for all 20 orders or once per
order. The refsim-only rate isolates what the cache saves. Prints a table and one JSON line.

    python bench/trace_reuse.py [--orders 20] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import time

from xla_backend import platform

platform.configure("cpu", 8)

import jax  # noqa: E402
import numpy as np  # noqa: E402

import refsim  # noqa: E402
import xla_backend  # noqa: E402
from conformance.compare import compare  # noqa: E402
from refsim import P  # noqa: E402
from refsim.interpreter import trace_cache  # noqa: E402


def program(a, b):
    """A small training-step-like body: matmul, psum over x, all_gather over y, a ppermute."""
    c = jnp_dot(a, b)
    c = jax.lax.psum(c, "x")
    g = jax.lax.all_gather(c, "y", axis=1, tiled=True)
    n = jax.lax.axis_size("y")
    r = jax.lax.ppermute(c, "y", [(i, (i + 1) % n) for i in range(n)])
    return jax.numpy.tanh(g).sum(axis=1, keepdims=True) + r


def jnp_dot(a, b):
    return jax.numpy.dot(a, b)


def _orders(n: int):
    base = ["default", "reversed", "transposed"]
    return (base + [("random", s) for s in range(n)])[:n]


def run(orders: int, repeat: int) -> list[dict]:
    a = np.arange(64, dtype=np.float32).reshape(8, 8) % 7
    b = np.arange(32, dtype=np.float32).reshape(8, 4) % 5
    meshes = [xla_backend.mesh((2, 4), ("x", "y"), o) for o in _orders(orders)]
    kw = dict(in_specs=(P("x", None), P(None, "y")), out_specs=P("x", "y"))
    expected_xla = {}
    for m in meshes:  # warm XLA's compile cache so both modes see the same XLA cost
        expected_xla[m] = xla_backend.shard_map(program, mesh=m, **kw)(a, b)
    rows = []
    for mode in ("no reuse", "trace reuse"):
        best_full = best_ref = float("inf")
        for _ in range(repeat):
            trace_cache.clear()
            ctx = trace_cache.disabled() if mode == "no reuse" else _null()
            with ctx:
                t0 = time.perf_counter()
                for m in meshes:
                    refsim.shard_map(program, mesh=m, **kw)(a, b)
                t_ref = time.perf_counter() - t0
            trace_cache.clear()
            with (trace_cache.disabled() if mode == "no reuse" else _null()):
                t0 = time.perf_counter()
                for m in meshes:
                    ours = refsim.shard_map(program, mesh=m, **kw)(a, b)
                    theirs = xla_backend.shard_map(program, mesh=m, **kw)(a, b)
                    res = compare(ours, theirs)
                    if not res.ok:
                        raise SystemExit(res.report())
                t_full = time.perf_counter() - t0
            best_full, best_ref = min(best_full, t_full), min(best_ref, t_ref)
        rows.append({"mode": mode, "orders": len(meshes), "examples_per_s": len(meshes) / best_full,
                     "refsim_runs_per_s": len(meshes) / best_ref, "traces": trace_cache.cache_info()["misses"]
                     if mode == "trace reuse" else len(meshes)})
    return rows


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orders", type=int, default=20)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    rows = run(args.orders, args.repeat)
    print(f"{'mode':<12} {'orders':>6} {'traces':>6} {'examples/s':>11} {'refsim runs/s':>14}")
    for r in rows:
        print(f"{r['mode']:<12} {r['orders']:>6} {r['traces']:>6} {r['examples_per_s']:>11.1f} "
              f"{r['refsim_runs_per_s']:>14.1f}")
    speed = {k: rows[1][k] / rows[0][k] for k in ("examples_per_s", "refsim_runs_per_s")}
    print(json.dumps({"bench": "trace_reuse", "jax": jax.__version__, "rows": rows,
                      "speedup": speed}))


if __name__ == "__main__":
    main()
