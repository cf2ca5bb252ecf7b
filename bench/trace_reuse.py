"""Conformance examples per second over 20 device orders of one program, with and without
refsim's trace reuse (`refsim.interpreter.trace_cache`).

One example is: refsim runs the program on a 2x4 mesh in one device order, XLA (through
xla_backend, on the 8 CPU devices) runs it on the same mesh, and `conformance.verdict.compare`
checks every device's shard. The XLA side compiles once per mesh either way (jax.jit's
cache is keyed by devices; warmed before timing); refsim either traces once for all orders
or once per order. The refsim-only rate isolates what the cache saves. After one untimed
round, the two modes are timed in equal, interleaved passes (each pass starts from an empty
trace cache); each rate is the median of the passes, with their range. Prints a table and
one JSON line per mode; `--markdown` prints the block docs/layout-details.md shows, and
`--docs PAGE` rewrites that block in PAGE (between its `bench/trace_reuse.py` markers) with
this run's figures:

    python -m bench.trace_reuse [--orders 20] [--repeat 5] [--markdown] [--docs docs/layout-details.md]
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys

if __package__ in (None, ""):  # run as `python bench/trace_reuse.py`: import the checkout's packages
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from bench import _common as C  # noqa: E402

MODES = ("no reuse", "trace reuse")
BEGIN, END = "<!-- bench/trace_reuse.py --docs: begin -->", "<!-- bench/trace_reuse.py --docs: end -->"


def program(a, b):
    """A small training-step-like body: matmul, psum over x, all_gather over y, a ppermute."""
    import jax

    c = jax.numpy.dot(a, b)
    c = jax.lax.psum(c, "x")
    g = jax.lax.all_gather(c, "y", axis=1, tiled=True)
    n = jax.lax.axis_size("y")
    r = jax.lax.ppermute(c, "y", [(i, (i + 1) % n) for i in range(n)])
    return jax.numpy.tanh(g).sum(axis=1, keepdims=True) + r


def _orders(n: int):
    base = ["default", "reversed", "transposed"]
    return (base + [("random", s) for s in range(n)])[:n]


def run(orders: int = 20, repeat: int = 5) -> list[dict]:
    """One record per mode (rates are medians over `repeat` interleaved passes) and a speedup record."""
    from xla_backend import platform

    platform.configure("cpu", 8)
    import numpy as np

    import refsim
    import xla_backend
    from conformance.verdict.compare import compare
    from refsim import P
    from refsim.interpreter import trace_cache

    a = np.arange(64, dtype=np.float32).reshape(8, 8) % 7
    b = np.arange(32, dtype=np.float32).reshape(8, 4) % 5
    meshes = [xla_backend.mesh((2, 4), ("x", "y"), o) for o in _orders(orders)]
    kw = dict(in_specs=(P("x", None), P(None, "y")), out_specs=P("x", "y"))
    for m in meshes:  # warm XLA's compile cache so both modes see the same XLA cost
        xla_backend.shard_map(program, mesh=m, **kw)(a, b)
    traces = {}

    def refsim_only(mode):
        trace_cache.clear()
        with trace_cache.disabled() if mode == "no reuse" else contextlib.nullcontext():
            for m in meshes:
                refsim.shard_map(program, mesh=m, **kw)(a, b)

    def examples(mode):
        trace_cache.clear()
        with trace_cache.disabled() if mode == "no reuse" else contextlib.nullcontext():
            for m in meshes:
                res = compare(refsim.shard_map(program, mesh=m, **kw)(a, b),
                              xla_backend.shard_map(program, mesh=m, **kw)(a, b))
                if not res.ok:
                    raise SystemExit(res.report())
        traces[mode] = trace_cache.cache_info()["misses"] if mode == "trace reuse" else len(meshes)

    fns = {(kind, mode): (lambda f=f, mode=mode: f(mode))
           for kind, f in (("refsim", refsim_only), ("examples", examples)) for mode in MODES}
    for f in fns.values():  # one untimed round: JAX's and refsim's first-call costs are not the cache's
        f()
    st = {k: C.stats(ts) for k, ts in C.interleaved(fns, repeat).items()}
    n = len(meshes)
    out = []
    for mode in MODES:
        full, ref = st["examples", mode], st["refsim", mode]
        rec = dict(bench="trace_reuse", mode=mode, orders=n, traces=traces[mode],
                   examples_per_s=n / full["median"], refsim_runs_per_s=n / ref["median"],
                   timing=full, refsim_timing=ref)
        C.emit(rec)
        out.append(rec)
    speed = dict(bench="trace_reuse", mode="speedup", orders=n,
                 examples_per_s=out[1]["examples_per_s"] / out[0]["examples_per_s"],
                 refsim_runs_per_s=out[1]["refsim_runs_per_s"] / out[0]["refsim_runs_per_s"])
    C.emit(speed)
    return out + [speed]


def _rows(records: list[dict]) -> list[tuple]:
    rows = [(r["mode"], r["traces"], C.fmt_stat(r["timing"], r["orders"]), C.fmt_stat(r["refsim_timing"], r["orders"]))
            for r in records if r["mode"] in MODES]
    s = next((r for r in records if r["mode"] == "speedup"), None)
    if s:
        rows.append(("reuse / no reuse", "", f"{s['examples_per_s']:.2f}x", f"{s['refsim_runs_per_s']:.2f}x"))
    return rows


HEADER = ["mode", "traces", "examples/s", "refsim runs/s"]


def show(records: list[dict]) -> None:
    r0 = records[0]
    C.table(f"trace reuse: {r0['orders']} device orders of one program, 2x4 mesh (medians of "
            f"{r0['timing']['passes']} interleaved passes (range))", HEADER, _rows(records))


def markdown(records: list[dict], machine: dict, command: str) -> str:
    """The docs block: how and where the figures were measured, then the table (no hand-typed numbers)."""
    r0 = records[0]
    m = machine
    lines = [BEGIN, "",
             f"`{command}` ({r0['orders']} device orders; rates are medians of {r0['timing']['passes']} "
             f"interleaved passes per mode, range in brackets) at commit `{m.get('commit')}`, {m.get('date')}, on "
             f"{m.get('cpu')} ({m.get('cores')} cores, shared), Python {m.get('python')}, NumPy {m.get('numpy')}, "
             f"JAX {m.get('jax')}:", "",
             "| " + " | ".join(HEADER) + " |", "|---|---:|---:|---:|"]
    lines += ["| " + " | ".join(str(v) for v in row) + " |" for row in _rows(records)]
    return "\n".join(lines + ["", END])


def replace_block(page: str, block: str) -> str:
    """`page` with the text between the BEGIN and END markers (inclusive) replaced by `block`."""
    pat = re.compile(re.escape(BEGIN) + ".*?" + re.escape(END), re.S)
    if not pat.search(page):
        raise ValueError(f"the page has no {BEGIN!r} ... {END!r} block; add the two markers where the table goes.")
    return pat.sub(lambda _: block, page, count=1)


def main(argv=None):
    from conformance import validation

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--orders", type=validation.option("--orders", integer=True, low=1), default=20)
    ap.add_argument("--repeat", type=validation.option("--repeat", integer=True, low=1),
                    default=5, help="interleaved passes per mode (default 5)")
    ap.add_argument("--markdown", action="store_true", help="also print the docs block of this run")
    ap.add_argument("--docs", metavar="PAGE", help="rewrite the block between the markers in PAGE with this run")
    args = ap.parse_args(argv)
    recs = run(args.orders, args.repeat)
    show(recs)
    if args.markdown or args.docs:
        command = f"python -m bench.trace_reuse --orders {args.orders} --repeat {args.repeat}"
        block = markdown(recs, C.machine(), command)
        if args.markdown:
            print(block)
        if args.docs:
            with open(args.docs) as f:
                page = f.read()
            with open(args.docs, "w") as f:
                f.write(replace_block(page, block))
            print(f"wrote {args.docs}")
    return recs


if __name__ == "__main__":
    main()
