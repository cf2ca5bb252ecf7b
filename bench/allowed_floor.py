"""The least a per-element bound walk can cost in NumPy, op by op: `python -m bench.allowed_floor
[--sizes 1e3,1e4,1e5,1e6] [--passes N] [--json FILE] [--markdown]`.

Issue 39 asks for refsim with bounds at most 1.5x refsim without. This bench measures the floor
of any walk that keeps, per element, a center and a rigorous bound, evaluated with NumPy calls
(which is how refsim evaluates): for each op, against refsim's own floor (the op once, in the
program's dtype, float32), it times

* **per element** (what the issue asks): the center in float64 (so that refsim's own rounding is
  not inside the bound) and the bound's first-order propagation plus the op's own rounding, in the
  fewest NumPy calls we could write (magnitudes of the operands taken as given: a walk keeps them):
  add `c = a + b; e = ea + eb + u|c|`; mul `c = a b; e = |a| eb + |b| ea + ea eb + u|c|`; exp
  `c = exp(a); e = c expm1(ea) + u' c`; sum over the last axis `c = sum(a); e = sum(ea) + g sum|a|`;
  dot (K = 64) `c = a @ b; e = |a| @ eb + ea @ |b| + g |a| @ |b|` (three float64 matmuls and the
  center's);
* **per array** (looser than the issue asks, for scale): one bound number per array over
  refsim's own values, `e = ea + eb + u max|c|` etc.: the walk is one reduction per op.

beside refsim's and the walk's real cost on the same one-equation jaxpr (`refsim.evaluate` and
`refsim.bounds.evaluate`, each call's set-up included, as conformance.check pays it) and the bare
NumPy op. The clock is `time.process_time`, the passes interleaved, BLAS as NumPy's build sets it
(the same for every column). Reported: CPU-us per call (median of the passes, and their range)
and (refsim + X) / refsim for X the walk, the per-element floor and the per-array floor: the
issue's cost ratio as it is, and as it would be if a walk cost nothing beyond its floor. The
machine's load average is printed before and after.
"""
from __future__ import annotations

import argparse
import os

import numpy as np

from bench import _common as C

U32 = 2.0 ** -24
G64 = 64 * U32 / (1 - 64 * U32)


def _data(op: str, n: int, seed: int = 0) -> dict:
    rng = np.random.default_rng(seed)
    if op == "dot":
        m = max(n // 64, 1)
        a, b = rng.normal(size=(m, 64)), rng.normal(size=(64, 64))
    elif op == "sum":
        a, b = rng.normal(size=(max(n // 64, 1), 64)), None
    else:
        a, b = rng.normal(size=n), rng.normal(size=n)
    d = {"a32": a.astype(np.float32), "a": a.astype(np.float32).astype(np.float64)}
    d["ea"] = np.abs(d["a"]) * 4 * U32
    d["abs_a"] = np.abs(d["a"])
    if b is not None:
        d["b32"] = b.astype(np.float32)
        d["b"] = b.astype(np.float32).astype(np.float64)
        d["eb"] = np.abs(d["b"]) * 4 * U32
        d["abs_b"] = np.abs(d["b"])
    return d


def _program(op: str):
    """The op as a one-equation JAX function (what refsim and the walk evaluate)."""
    import jax.numpy as jnp

    return {"add": lambda a, b: a + b, "mul": lambda a, b: a * b, "exp": lambda a: jnp.exp(a),
            "sum": lambda a: jnp.sum(a, axis=-1), "dot": lambda a, b: a @ b}[op]


def _closed(op: str, d: dict):
    import jax

    args = [d["a32"]] + ([d["b32"]] if op in ("add", "mul", "dot") else [])
    return jax.make_jaxpr(_program(op))(*args), args


def refsim_rule(op: str, d: dict):
    """refsim's own evaluation of the one-equation jaxpr (`refsim.evaluate`, as conformance.check
    runs it): the rule, the interpreter's dispatch and the result's placement."""
    import refsim

    closed, args = _closed(op, d)
    return lambda: refsim.evaluate(closed, args)


def walk_rule(op: str, d: dict):
    """The bound walk of the same jaxpr (`refsim.bounds.evaluate`): what conformance.check adds."""
    from refsim import bounds

    closed, args = _closed(op, d)
    return lambda: bounds.evaluate(closed, args)


def numpy_op(op: str, d: dict):
    """The op once in float32 with NumPy: the least any refsim rule does."""
    if op == "add":
        return lambda: np.add(d["a32"], d["b32"])
    if op == "mul":
        return lambda: np.multiply(d["a32"], d["b32"])
    if op == "exp":
        return lambda: np.exp(d["a32"])
    if op == "sum":
        return lambda: np.sum(d["a32"], axis=-1)
    return lambda: np.matmul(d["a32"], d["b32"])


def per_element_floor(op: str, d: dict):
    """Center (float64) and per-element bound in the fewest NumPy calls (module docstring)."""
    a, b, ea, eb, aa, ab = (d.get(k) for k in ("a", "b", "ea", "eb", "abs_a", "abs_b"))

    def add():
        c = a + b
        e = ea + eb
        e += U32 * np.abs(c)
        return c, e

    def mul():
        c = a * b
        e = aa * eb
        e += ab * ea
        e += ea * eb
        e += U32 * np.abs(c)
        return c, e

    def exp():
        c = np.exp(a)
        e = c * np.expm1(ea)
        e += 4 * U32 * c
        return c, e

    def sum_():
        c = np.sum(a, axis=-1)
        e = np.sum(ea, axis=-1)
        e += G64 * np.sum(aa, axis=-1)
        return c, e

    def dot():
        c = a @ b
        e = aa @ eb
        e += ea @ ab
        e += G64 * (aa @ ab)
        return c, e

    return {"add": add, "mul": mul, "exp": exp, "sum": sum_, "dot": dot}[op]


def per_array_floor(op: str, d: dict):
    """One bound number per array over refsim's own values: a max |value| per op."""
    c = numpy_op(op, d)()

    def f():
        return max(float(np.max(c)), -float(np.min(c)))

    return f


def measure(op: str, n: int, passes: int) -> dict:
    d = _data(op, n)
    fns = {"refsim": refsim_rule(op, d), "walk": walk_rule(op, d), "element": per_element_floor(op, d),
           "array": per_array_floor(op, d), "numpy": numpy_op(op, d)}
    for f in fns.values():
        f()                                        # warm: the first call of a rule imports and traces
    reps = max(1, int(2e5 // max(n, 1)))          # small arrays: many calls per timed pass

    def rep(fn):
        def run():
            for _ in range(reps):
                fn()
        return run

    times = C.interleaved({k: rep(f) for k, f in fns.items()}, passes, clock=C.time.process_time)
    st = {k: C.stats([t / reps for t in v]) for k, v in times.items()}
    r = st["refsim"]["median"]
    return {"bench": "allowed_floor", "op": op, "elements": n, "passes": passes, "calls_per_pass": reps,
            **{f"{k}_us": {q: v * 1e6 if q not in ("spread", "passes") else v for q, v in s.items()}
               for k, s in st.items()},
            "ratio_walk": (r + st["walk"]["median"]) / r,
            "ratio_element": (r + st["element"]["median"]) / r, "ratio_array": (r + st["array"]["median"]) / r}


def _us(s: dict) -> str:
    return f"{s['median']:.3g} ({s['min']:.3g}–{s['max']:.3g})"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.allowed_floor", description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="1e3,1e4,1e5,1e6", help="elements per array (comma-separated)")
    ap.add_argument("--ops", default="add,mul,exp,sum,dot")
    ap.add_argument("--passes", type=int, default=7)
    ap.add_argument("--json", default=None, help="also write the records as JSON lines here")
    ap.add_argument("--markdown", action="store_true", help="print the table as Markdown too")
    args = ap.parse_args(argv)
    sizes = [int(float(s)) for s in args.sizes.split(",")]
    ops = args.ops.split(",")
    C.open_json(args.json)
    print(f"load average before: {os.getloadavg()[0]:.2f}; commit {C.git_commit()}")
    rows, recs = [], []
    for op in ops:
        for n in sizes:
            rec = measure(op, n, args.passes)
            C.emit(rec)
            recs.append(rec)
            rows.append((op, f"{n:.0e}", _us(rec["numpy_us"]), _us(rec["refsim_us"]), _us(rec["walk_us"]),
                         _us(rec["element_us"]), _us(rec["array_us"]), f"{rec['ratio_walk']:.2f}",
                         f"{rec['ratio_element']:.2f}", f"{rec['ratio_array']:.2f}"))
    cols = ("op", "elements", "NumPy op, us", "refsim, us", "walk, us", "per-element floor, us",
            "per-array floor, us", "(refsim + walk) / refsim", "(refsim + per-element floor) / refsim",
            "(refsim + per-array floor) / refsim")
    C.table("The bound walk and its floor in NumPy, per op (CPU time, medians and ranges of interleaved passes)",
            cols, rows)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if args.markdown:
        print("\n| " + " | ".join(cols) + " |\n|" + "---|" * len(cols))
        for r in rows:
            print("| " + " | ".join(map(str, r)) + " |")
    C.close_json()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
