"""Bandwidth: each collective through `refsim.shard_map` against `np.copyto` of the bytes it moves.

psum, tiled all_gather, tiled all_to_all, ring ppermute and tiled psum_scatter, each as its own
`refsim.shard_map` program on one float32 array of `mib` MiB: on a 1-D mesh of N devices
(P('i')), and on a 64 x 64 mesh (P('x', 'y')) over each axis. A timed call is the public path
end to end: NumPy in, the refsim.Array out, `np.asarray` of it (so a lazy view pays for its
data movement). The reference is `np.copyto` of the bytes the collective must move: the
larger of its global input and global output. The copy and the collectives are timed in
equal interleaved passes; each figure is the median. Target: every ratio <= 3.

all_to_all's transposing copy splits large arrays over threads (`refsim.collectives.alltoall.threads`,
``$REFSIM_NUM_THREADS``) while `np.copyto` uses one: the row "all_to_all, 1 thread" times it
with ``REFSIM_NUM_THREADS=1`` as well, so both figures are on the table.

    python -m bench.bandwidth [--quick] [--mib 64] [--devices 8 64 512 4096] [--repeat 5] [--no-2d]
"""
from __future__ import annotations

import argparse
import contextlib
import os

import numpy as np

from bench import _common as C

DEVICES = (8, 64, 512, 4096)
MESH_2D = (64, 64)
QUICK = dict(mib=1, devices=(8,), repeat=2)
OPS = ("psum", "all_gather", "all_to_all", "ppermute", "psum_scatter")


def programs(axis: str, k: int, other: str | None):
    """name -> (function, out_specs, check_vma) for the collectives over `axis` (size k).

    Outputs invariant over `axis` are laid out replicated over it (P(None, other) on 2-D);
    all_gather's result is invariant but its type is varying, so it runs with check_vma=False.
    """
    from jax import lax
    from refsim import P

    ring = [(j, (j + 1) % k) for j in range(k)]
    inv = P() if other is None else (P(None, other) if axis == "x" else P(other, None))
    var = P("i") if other is None else P("x", "y")
    concat = 0 if other is None else 1
    return {
        "psum": (lambda v: lax.psum(v, axis), inv, True),
        "all_gather": (lambda v: lax.all_gather(v, axis, axis=0, tiled=True), inv, False),
        "all_to_all": (lambda v: lax.all_to_all(v, axis, 0, concat, tiled=True), var, True),
        "ppermute": (lambda v: lax.ppermute(v, axis, ring), var, True),
        "psum_scatter": (lambda v: lax.psum_scatter(v, axis, scatter_dimension=0, tiled=True), var, True),
    }


ONE_THREAD = "all_to_all, 1 thread"


@contextlib.contextmanager
def _threads(n: int):
    """refsim's copy kernel limited to `n` threads for the block (`REFSIM_NUM_THREADS`)."""
    old = os.environ.get("REFSIM_NUM_THREADS")
    os.environ["REFSIM_NUM_THREADS"] = str(n)
    try:
        yield
    finally:
        if old is None:
            del os.environ["REFSIM_NUM_THREADS"]
        else:
            os.environ["REFSIM_NUM_THREADS"] = old


def _one_thread(fn):
    def call():
        with _threads(1):
            return fn()
    return call


def _layouts(mib: float, devices, two_d: bool):
    """(label, mesh, in spec, global shape, axis, axis size, other axis) per configuration."""
    from refsim import Mesh, P

    elements = int(mib * 2**20) // 4
    out = []
    for n in devices:
        per = elements // n
        if per % n or per < 1:
            raise ValueError(f"mib={mib} over devices={n} gives {per} elements per device, not a multiple of "
                             f"{n} (all_to_all and psum_scatter split it {n} ways); raise mib or lower devices.")
        out.append((f"{n}", Mesh((n,), ("i",)), P("i"), (n * per,), "i", n, None))
    if two_d:
        X, Y = MESH_2D
        per = elements // (X * Y)
        r = max(X, Y, 2 ** (int(np.log2(per)) // 2))
        if per % r or (per // r) < 1:
            raise ValueError(f"mib={mib} is too small for the {X}x{Y} mesh; pass --no-2d or a larger --mib.")
        for axis, other, k in (("x", "y", X), ("y", "x", Y)):
            out.append((f"{X}x{Y} over {axis}", Mesh((X, Y), ("x", "y")), P("x", "y"), (X * r, Y * (per // r)),
                        axis, k, other))
    return out


def run(quick: bool = False, mib: float | None = None, devices=None, repeat: int | None = None,
        two_d: bool | None = None) -> list[dict]:
    import refsim

    mib = mib or (QUICK["mib"] if quick else 64)
    devices = tuple(devices or (QUICK["devices"] if quick else DEVICES))
    repeat = repeat or (QUICK["repeat"] if quick else 5)
    two_d = (not quick) if two_d is None else two_d
    out = []
    for label, mesh, spec, shape, axis, k, other in _layouts(mib, devices, two_d):
        a = (np.arange(int(np.prod(shape))) % 7).astype(np.float32).reshape(shape)
        fns, moved = {}, {}
        for name, (f, out_spec, vma) in programs(axis, k, other).items():
            fn = refsim.shard_map(f, mesh=mesh, in_specs=spec, out_specs=out_spec, check_vma=vma)
            moved[name] = max(a.nbytes, np.asarray(fn(a)).nbytes)  # also the first (tracing) call
            fns[name] = (lambda fn=fn: np.asarray(fn(a)))
        fns[ONE_THREAD] = _one_thread(fns["all_to_all"])
        moved[ONE_THREAD] = moved["all_to_all"]
        srcs = {b: np.ones(b // 4, np.float32) for b in set(moved.values())}
        dsts = {b: np.empty_like(s) for b, s in srcs.items()}
        timed = {f"copy{b}": (lambda b=b: np.copyto(dsts[b], srcs[b])) for b in srcs}
        timed.update(fns)
        st = {key: C.stats(ts) for key, ts in C.interleaved(timed, repeat).items()}
        from refsim.collectives.alltoall import threads

        for name in fns:
            copy = st[f"copy{moved[name]}"]
            rec = dict(bench="bandwidth", op=name, layout=label, devices=mesh.size, mib=mib,
                       threads=1 if name == ONE_THREAD else threads(),
                       seconds=st[name]["median"], timing=st[name], bytes_moved=moved[name],
                       copyto_seconds=copy["median"], ratio_to_copyto=st[name]["median"] / copy["median"],
                       copy_gb_per_s=moved[name] / copy["median"] / 1e9)
            C.emit(rec)
            out.append(rec)
    return out


def show(records: list[dict]) -> None:
    ops = list(dict.fromkeys(r["op"] for r in records))
    lays = list(dict.fromkeys(r["layout"] for r in records))
    by = {(r["op"], r["layout"]): r for r in records}
    mib = records[0]["mib"] if records else 0
    copy = {lay: min(r["copyto_seconds"] for r in records if r["layout"] == lay) for lay in lays}
    rows = [("np.copyto", *(C.fmt_seconds(copy[lay]) for lay in lays))]
    for op in ops:
        rows.append((op, *(f"{C.fmt_seconds(by[op, lay]['seconds'])} = {by[op, lay]['ratio_to_copyto']:.1f}x"
                           for lay in lays)))
    C.table(f"bandwidth: refsim.shard_map call + np.asarray / np.copyto of the bytes moved ({mib:g} MiB float32, "
            "medians)", ["collective", *(f"{lay} devices" if lay.isdigit() else lay for lay in lays)], rows)


def main(argv=None):
    from conformance import validation

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 MiB on 8 devices, no 2-D mesh")
    ap.add_argument("--mib", type=validation.option("--mib", low=0))
    ap.add_argument("--devices", type=validation.option("--devices", integer=True, low=1), nargs="+")
    ap.add_argument("--repeat", type=validation.option("--repeat", integer=True, low=1))
    ap.add_argument("--no-2d", action="store_true", help="leave out the 64 x 64 mesh")
    args = ap.parse_args(argv)
    recs = run(args.quick, args.mib, args.devices, args.repeat, None if not args.no_2d else False)
    show(recs)
    return recs


if __name__ == "__main__":
    main()
