"""How small a planted error `conformance.check` catches: the 256-ulp heuristic vs the allowed set.

    python -m bench.sensitivity [--ks 1,2,4,...,1024] [--seed 0] [--quick]

A lowering fault (`conformance.faults.lowering`) makes every float32 multiplication of XLA's side
k units of roundoff wrong: each product times ``(1 + k * 2**-24)``, where StableHLO's multiply is
IEEE's correctly rounded product. The program multiplies and adds float32 values drawn
log-uniformly from 1e-3 to 1e3 (both signs): an elementwise ``x * y + z * x``, row sums of
``x * y`` and a matmul of ``x * z`` with ``y``. For each k the call is checked under

* ``heuristic``: the scaled bound alone (256 units of roundoff of max|output|, as before issue 39);
* ``auto``: the allowed set (per-element bounds from the program, XLA:CPU's declared
  relaxations in force), tighter of it and the heuristic per element;
* ``spec``: the allowed set without relaxations,

and the smallest k caught is reported per policy and per output. A second row is the pmean of
int32 over 5 devices (issue 39): XLA's algebraic simplifier divides by 5 as ``x * 0.2`` (9 gives
1.8000001 where 9 / 5 rounds to 1.8, 0x3FE66666), an undocumented rewrite: the spec policy
disagrees naming the division, the default one agrees and names the relaxation that admits it.

Prints a table and one JSON line per figure; nothing is timed.
"""
from __future__ import annotations

import argparse
import os
import sys

DEVICES = 8
KS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
POLICIES = ("heuristic", "auto", "spec")


def _configure():
    if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
        os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                                   + f" --xla_force_host_platform_device_count={DEVICES}").strip()


def program(x, y, z):
    """Products and sums (the module docstring)."""
    import jax.numpy as jnp

    return x * y + z * x, jnp.sum(x * y, axis=1), (x * z) @ y.T


def inputs(seed: int = 0, shape=(16, 16)):
    import numpy as np

    rng = np.random.default_rng(seed)

    def draw():
        mags = 10.0 ** rng.uniform(-3, 3, shape)
        return (mags * rng.choice([-1.0, 1.0], shape)).astype(np.float32)

    return draw(), draw(), draw()


def product_fault(k: int):
    """The lowering fault: every float32 `mul` returns its product times (1 + k * 2**-24)."""
    import numpy as np

    from conformance.faults import lowering

    factor = np.float32(1 + k * 2.0 ** -24)
    inside = []          # the scaling multiply lowers through this same rule: not scaled again

    def scaled(orig, env):
        def rule(ctx, *args, **params):
            (aval,) = ctx.avals_out
            (out,) = orig(ctx, *args, **params)
            if aval.dtype != np.float32 or inside:
                return [out]
            inside.append(True)
            try:
                return [lowering.apply(ctx, lambda a: a * factor, out, aval, aval)]
            finally:
                inside.pop()
        return rule

    return lowering.Fault(f"mul_times_1_plus_{k}u", f"float32 multiply returns its product times (1 + {k} * 2**-24)",
                          ("mul",), scaled)


def caught(fn, args, policy: str, fault=None) -> tuple[bool, list]:
    """(the check disagreed, the outputs that disagreed)."""
    import contextlib

    import conformance
    from conformance import faults

    scope = faults.inject(fault) if fault is not None else contextlib.nullcontext()
    with scope:
        try:
            conformance.check(fn, *args, policy=policy, explain=False)
            return False, []
        except conformance.ConformanceError as e:
            return True, sorted({m.output for m in e.result.comparison.mismatches})


def pmean_rewrite() -> dict:
    """The pmean-over-5 row: per policy, the verdict and the report's line naming the op."""
    import jax
    import numpy as np
    from jax.sharding import PartitionSpec as P

    import conformance

    mesh = jax.make_mesh((5,), ("i",), axis_types=(jax.sharding.AxisType.Auto,))
    x = np.array([9, 0, 0, 0, 0], np.int32)
    xla = float(np.asarray(jax.jit(jax.shard_map(lambda v: jax.lax.pmean(v, "i"), mesh=mesh, in_specs=P("i"),
                                                 out_specs=P()))(x))[0])
    out = {"xla": xla, "correctly_rounded": float(np.float32(9) / np.float32(5))}
    for policy in POLICIES:
        try:
            res = conformance.check(lambda v: jax.lax.pmean(v, "i"), x, mesh=mesh, in_specs=P("i"), out_specs=P(),
                                    policy=policy, explain=False)
            lines = [ln for ln in res.bounds if "relaxation" in ln]
            out[policy] = {"verdict": "agree", "note": lines[0] if lines else ""}
        except conformance.ConformanceError as e:
            text = str(e)
            note = next((ln.strip() for ln in text.splitlines() if "policy: allowed set" in ln), "")
            out[policy] = {"verdict": "disagree", "note": note[note.find("; the failing") + 2:] if note else ""}
    return out


def main(argv=None) -> list:
    _configure()
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ks", default=",".join(map(str, KS)), help="planted errors, in units of roundoff")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="k in 1, 8, 1024 only")
    a = ap.parse_args(argv)
    ks = (1, 8, 1024) if a.quick else tuple(int(k) for k in a.ks.split(","))

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import jax

    from bench import _common as C

    fn = jax.jit(program)
    args = inputs(a.seed)
    records, rows = [], []
    healthy = {p: caught(fn, args, p)[0] for p in POLICIES}
    smallest = {p: None for p in POLICIES}
    smallest_out = {p: {} for p in POLICIES}
    for k in ks:
        fault = product_fault(k)
        row = [k]
        for p in POLICIES:
            hit, outs = caught(fn, args, p, fault)
            row.append(("caught " + ",".join(map(str, outs))) if hit else "agrees")
            if hit and smallest[p] is None:
                smallest[p] = k
            for o in outs:
                smallest_out[p].setdefault(o, k)
            records.append({"bench": "sensitivity", "k": k, "policy": p, "caught": hit, "outputs": outs})
        rows.append(row)
    C.table("planted k-ulp error in every float32 product: verdict per policy (outputs that disagree)",
            ["k", *POLICIES], rows)
    summary = {"bench": "sensitivity_summary", "program": "x*y + z*x, sum(x*y, 1), (x*z) @ y.T on 16x16 float32 "
               "in +-[1e-3, 1e3]", "seed": a.seed, "healthy_disagrees": healthy,
               "smallest_k_caught": smallest, "smallest_k_caught_per_output": smallest_out}
    C.table("smallest k caught", ["policy", "any output", "x*y+z*x", "sum(x*y)", "(x*z)@y.T", "healthy run"],
            [[p, smallest[p], *[smallest_out[p].get(o) for o in range(3)], "disagrees" if healthy[p] else "agrees"]
             for p in POLICIES])
    pm = pmean_rewrite()
    C.table("pmean of int32 [9, 0, 0, 0, 0] over 5 devices (XLA: x * 0.2)",
            ["policy", "verdict", "note"], [[p, pm[p]["verdict"], pm[p]["note"][:150]] for p in POLICIES])
    summary["pmean_over_5"] = pm
    for r in records:
        C.emit(r)
    C.emit(summary)
    return records + [summary]


if __name__ == "__main__":
    main()
