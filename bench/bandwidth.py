"""Bandwidth: each refsim collective against the memory-bandwidth limit of this machine.

For psum, tiled all_gather, tiled all_to_all, ring ppermute and tiled psum_scatter on one
stacked float32 array of `mib` MiB spread over N devices of a 1-D mesh, the figure is
refsim's time (the result made C-contiguous, so lazy views pay for their data movement)
divided by the time of `np.copyto` of the bytes the collective must move — the larger of
its input and its output in refsim's stacked form (an invariant result is stored once).
Repeats go round-robin over the copy and the collectives, so load from other processes
hits all of them alike; each figure is the minimum. Target: <= 3x.

    python -m bench.bandwidth [--quick] [--mib 64] [--devices 8 64 512 4096] [--repeat 7]
"""
from __future__ import annotations

import argparse
import time

import numpy as np

from bench import _common as C

DEVICES = (8, 64, 512, 4096)
QUICK = dict(mib=1, devices=(8,), repeat=2)


def collectives(n: int) -> dict:
    """name -> fn(stacked x, mesh) for the five collectives over the 1-D mesh axis 'i' of size n."""
    from refsim.collectives import api

    ring = [(j, (j + 1) % n) for j in range(n)]
    return {
        "psum": lambda x, m: api.psum(x, "i", mesh=m),
        "all_gather": lambda x, m: api.all_gather(x, "i", axis=0, tiled=True, mesh=m),
        "all_to_all": lambda x, m: api.all_to_all(x, "i", 0, 0, tiled=True, mesh=m),
        "ppermute": lambda x, m: api.ppermute(x, "i", ring, mesh=m),
        "psum_scatter": lambda x, m: api.psum_scatter(x, "i", scatter_dimension=0, tiled=True, mesh=m),
    }


def run(quick: bool = False, mib: float | None = None, devices=None, repeat: int | None = None) -> list[dict]:
    from refsim import Mesh

    mib = mib or (QUICK["mib"] if quick else 64)
    devices = tuple(devices or (QUICK["devices"] if quick else DEVICES))
    repeat = repeat or (QUICK["repeat"] if quick else 7)
    out = []
    for n in devices:
        per = int(mib * 2**20) // 4 // n
        if per % n:
            raise ValueError(f"mib={mib} over devices={n} gives {per} elements per device, not a multiple of "
                             f"{n} (all_to_all and psum_scatter split it {n} ways); raise mib or lower devices.")
        mesh = Mesh((n,), ("i",))
        x = np.random.default_rng(0).integers(0, 7, (n, per)).astype(np.float32)
        ops = collectives(n)
        moved = {}
        for name, fn in ops.items():
            y = fn(x, mesh)
            moved[name] = max(x.nbytes, np.asarray(y).nbytes)
        # one reference copy per distinct byte count (all are x.nbytes today; kept general)
        srcs = {b: np.ones(b // 4, np.float32) for b in set(moved.values())}
        dsts = {b: np.empty_like(s) for b, s in srcs.items()}
        timed = {f"copy{b}": (lambda b=b: np.copyto(dsts[b], srcs[b])) for b in srcs}
        timed.update({k: (lambda f=f: np.ascontiguousarray(f(x, mesh))) for k, f in ops.items()})
        best = dict.fromkeys(timed, float("inf"))
        for _ in range(repeat):
            for name, fn in timed.items():
                t = time.perf_counter()
                fn()
                best[name] = min(best[name], time.perf_counter() - t)
        for name in ops:
            copy_t = best[f"copy{moved[name]}"]
            rec = dict(bench="bandwidth", op=name, devices=n, mib=mib, seconds=best[name],
                       bytes_moved=moved[name], copyto_seconds=copy_t, ratio_to_copyto=best[name] / copy_t,
                       copy_gb_per_s=moved[name] / copy_t / 1e9)
            C.emit(rec)
            out.append(rec)
    return out


def show(records: list[dict]) -> None:
    ops = list(dict.fromkeys(r["op"] for r in records))
    devs = list(dict.fromkeys(r["devices"] for r in records))
    by = {(r["op"], r["devices"]): r for r in records}
    mib = records[0]["mib"] if records else 0
    copy = {n: min(r["copyto_seconds"] for r in records if r["devices"] == n) for n in devs}
    rows = [("np.copyto", *(C.fmt_seconds(copy[n]) for n in devs))]
    for op in ops:
        rows.append((op, *(f"{C.fmt_seconds(by[op, n]['seconds'])} = {by[op, n]['ratio_to_copyto']:.1f}x"
                           for n in devs)))
    C.table(f"bandwidth: refsim collective time / np.copyto time of the bytes moved ({mib} MiB float32)",
            ["collective", *(f"{n} devices" for n in devs)], rows)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="1 MiB on 8 devices")
    ap.add_argument("--mib", type=float)
    ap.add_argument("--devices", type=int, nargs="+")
    ap.add_argument("--repeat", type=int)
    args = ap.parse_args(argv)
    recs = run(args.quick, args.mib, args.devices, args.repeat)
    show(recs)
    return recs


if __name__ == "__main__":
    main()
