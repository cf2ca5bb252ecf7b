"""Micro-benchmark of refsim's vectorised collectives against the memory-bandwidth limit.

For psum / all_gather / all_to_all / ppermute on one stacked array of `--mib` MiB
(float32, spread over N virtual devices on a 1-D mesh), called as kernels (no tracing, no
refsim.Array; result made C-contiguous so a lazy view pays for its data movement), beside
`np.copy` of the same bytes. The copy and the ops are timed in `--repeat` equal, interleaved
passes (copy, psum, all_gather, ..., copy, psum, ...), so a burst of load from other
processes hits all of them; each figure is the median of its passes, with their range.
The ratio is median op / median copy (target: <= 3x). `--clock cpu` times with the process
CPU clock, which ignores time spent descheduled on a shared machine (memory stalls still
count). Prints a table and one JSON line per (op, devices).

    python -m bench.collectives                      # 64 MiB at 8, 64, 512, 4096 devices
    python bench/collectives.py --mib 16 --devices 8 64 [--repeat 5] [--clock cpu]
"""
from __future__ import annotations

import argparse
import os
import sys
import time

if __package__ in (None, ""):  # run as `python bench/collectives.py`: import the checkout's packages
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from bench import _common as C  # noqa: E402

CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}
OPS = ("psum", "all_gather", "all_to_all", "ppermute")


def kernels(x: np.ndarray, n: int) -> dict:
    """name -> zero-argument callable running that collective's kernel on the stacked `x` (n devices)."""
    from refsim import Mesh
    from refsim.collectives import alltoall, gather, permute, reductions

    mesh = Mesh((n,), ("i",))
    return {
        "psum": lambda: reductions.psum(x, mesh=mesh, axes=("i",), axis_index_groups=None),
        "all_gather": lambda: gather.all_gather(x, mesh=mesh, axis_name=("i",), all_gather_dimension=0,
                                                axis_size=n, axis_index_groups=None, tiled=True),
        "all_to_all": lambda: alltoall.all_to_all(x, mesh=mesh, axis_name=("i",), split_axis=0, concat_axis=0,
                                                  axis_index_groups=None, tiled=True),
        "ppermute": lambda: permute.ppermute(x, mesh=mesh, axis_name=("i",),
                                             perm=[(j, (j + 1) % n) for j in range(n)]),
    }


def run(mib: float, devices, repeat: int, clock: str = "wall") -> list[dict]:
    """One record per (op, devices): median seconds, the passes' stats, the copy's, and their ratio."""
    if clock not in CLOCKS:
        raise ValueError(f"clock={clock!r}; choose one of {', '.join(sorted(CLOCKS))}.")
    out = []
    for n in devices:
        per = int(mib * 2**20) // 4 // n
        per -= per % n  # all_to_all splits the local dim into n blocks
        if per < 1:
            raise ValueError(f"mib={mib} over devices={n} leaves no multiple of {n} elements per device; "
                             f"raise mib or lower devices.")
        x = np.random.default_rng(0).standard_normal((n, per), dtype=np.float32)
        # results may be lazy views (a transpose, a broadcast); materialise them so the
        # time includes the data movement a consumer would pay for
        timed = {"copy": lambda: np.copy(x)}
        timed.update({k: (lambda f=f: np.ascontiguousarray(f())) for k, f in kernels(x, n).items()})
        st = {k: C.stats(ts) for k, ts in C.interleaved(timed, repeat, CLOCKS[clock]).items()}
        copy = st.pop("copy")
        for name, s in st.items():
            rec = dict(bench="collectives", op=name, devices=n, mib=mib, clock=clock, seconds=s["median"],
                       timing=s, copy_seconds=copy["median"], copy_timing=copy,
                       ratio_to_copy=s["median"] / copy["median"])
            C.emit(rec)
            out.append(rec)
    return out


def show(records: list[dict]) -> None:
    devs = list(dict.fromkeys(r["devices"] for r in records))
    by = {(r["op"], r["devices"]): r for r in records}
    first = {d: next(r for r in records if r["devices"] == d) for d in devs}
    rows = [("np.copy", *(C.fmt_stat(first[d]["copy_timing"]) for d in devs))]
    for op in dict.fromkeys(r["op"] for r in records):
        rows.append((op, *(f"{C.fmt_stat(by[op, d]['timing'])} = {by[op, d]['ratio_to_copy']:.1f}x" for d in devs)))
    r0 = records[0] if records else dict(mib=0, clock="wall", timing=dict(passes=0))
    C.table(f"collective kernels / np.copy ({r0['mib']:g} MiB float32, {r0['clock']} clock, medians of "
            f"{r0['timing']['passes']} interleaved passes (range))", ["op", *(f"{d} devices" for d in devs)], rows)


def main(argv=None):
    from conformance import validation

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=validation.option("--mib", low=0), default=64)
    ap.add_argument("--devices", type=validation.option("--devices", integer=True, low=1),
                    nargs="+", default=[8, 64, 512, 4096])
    ap.add_argument("--repeat", type=validation.option("--repeat", integer=True, low=1),
                    default=5, help="interleaved passes (default 5)")
    ap.add_argument("--clock", choices=sorted(CLOCKS), default="wall")
    args = ap.parse_args(argv)
    recs = run(args.mib, args.devices, args.repeat, args.clock)
    show(recs)
    return recs


if __name__ == "__main__":
    main()
