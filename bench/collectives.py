"""Micro-benchmark of refsim's vectorised collectives against the memory-bandwidth limit.

For psum / all_gather / all_to_all / ppermute on one stacked array of `--mib` MiB
(float32, spread over N virtual devices on a 1-D mesh), prints the best-of-`--repeat`
time (result made C-contiguous), the time of `np.copy` of the same bytes, and their
ratio (target: <= 3x), as a table and one JSON line per figure. Repeats go round-robin
over the copy and the ops, so a burst of load from other processes hits all of them;
`--clock cpu` times with the process CPU clock, which ignores time spent descheduled
on a shared machine (memory stalls still count).

    python bench/collectives.py                      # 64 MiB at 8, 64, 512, 4096 devices
    python bench/collectives.py --mib 16 --devices 8 64
"""
from __future__ import annotations

import argparse
import json
import time

import numpy as np

from refsim import Mesh
from refsim.collectives import alltoall, gather, permute, reductions


_CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def run(mib: int, devices: list[int], repeat: int, clock: str = "wall"):
    now = _CLOCKS[clock]
    rows = []
    for n in devices:
        mesh = Mesh((n,), ("i",))
        per = (mib * 2**20) // 4 // n
        per -= per % n  # all_to_all splits the local dim into n blocks
        x = np.random.default_rng(0).standard_normal((n, per), dtype=np.float32)
        ops = {
            "psum": lambda: reductions.psum(x, mesh=mesh, axes=("i",), axis_index_groups=None),
            "all_gather": lambda: gather.all_gather(x, mesh=mesh, axis_name=("i",),
                                                    all_gather_dimension=0, axis_size=n,
                                                    axis_index_groups=None, tiled=True),
            "all_to_all": lambda: alltoall.all_to_all(x, mesh=mesh, axis_name=("i",),
                                                      split_axis=0, concat_axis=0,
                                                      axis_index_groups=None, tiled=True),
            "ppermute": lambda: permute.ppermute(x, mesh=mesh, axis_name=("i",),
                                                 perm=[(j, (j + 1) % n) for j in range(n)]),
        }
        # results may be lazy views (a transpose, a broadcast); materialise them so the
        # time includes the data movement a consumer would pay for
        timed = {"copy": lambda: np.copy(x)}
        timed.update({k: (lambda f=f: np.ascontiguousarray(f())) for k, f in ops.items()})
        best = dict.fromkeys(timed, float("inf"))
        for _ in range(repeat):
            for name, fn in timed.items():
                t = now()
                fn()
                best[name] = min(best[name], now() - t)
        copy_t = best.pop("copy")
        for name, t in best.items():
            rows.append(dict(op=name, devices=n, mib=mib, clock=clock, seconds=t,
                             copy_seconds=copy_t, ratio_to_copy=t / copy_t))
    return rows


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--devices", type=int, nargs="+", default=[8, 64, 512, 4096])
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--clock", choices=sorted(_CLOCKS), default="wall")
    args = ap.parse_args(argv)
    rows = run(args.mib, args.devices, args.repeat, args.clock)
    print(f"{'op':<12}{'devices':>8}{'MiB':>6}{'time ms':>10}{'copy ms':>10}{'ratio':>8}")
    for r in rows:
        print(f"{r['op']:<12}{r['devices']:>8}{r['mib']:>6}{r['seconds'] * 1e3:>10.2f}"
              f"{r['copy_seconds'] * 1e3:>10.2f}{r['ratio_to_copy']:>8.2f}")
    for r in rows:
        print(json.dumps({"bench": "refsim.collectives", **r}))
    return rows


if __name__ == "__main__":
    main()
