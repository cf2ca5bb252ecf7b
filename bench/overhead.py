"""Overhead: what a cached `refsim.shard_map` call costs apart from moving data, 8 to 65536 devices.

A ring ppermute and a psum over one float32 element per device (the `tiny` program of
`bench.scaling`), its result read back with `np.asarray`, each (engine, devices) in its own
process: refsim at every device count, XLA:CPU where it runs (see `bench.scaling`). The
figure is the median of repeated calls after the first (the trace is cached), with spread.
Target: <= 1 ms at 16384 devices, i.e. no per-device Python on a call.

    python -m bench.overhead [--quick] [--devices 8 64 ...] [--repeat 20]
"""
from __future__ import annotations

import argparse

from bench import scaling

QUICK = dict(devices=(8, 64), repeat=2)
REPEAT = 20  # calls are short: more of them make a steadier median


def run(quick: bool = False, devices=None, repeat: int | None = None) -> list[dict]:
    devices = devices or (QUICK["devices"] if quick else scaling.TINY_DEVICES)
    return scaling.run(quick=quick, devices=devices, repeat=repeat or (QUICK["repeat"] if quick else REPEAT),
                       program_name="tiny")


def show(records: list[dict]) -> None:
    scaling.show(records)


def main(argv=None):
    from conformance import validation

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="8 and 64 devices")
    ap.add_argument("--devices", type=validation.option("--devices", integer=True, low=1), nargs="+")
    ap.add_argument("--repeat", type=validation.option("--repeat", integer=True, low=1))
    args = ap.parse_args(argv)
    recs = run(args.quick, args.devices, args.repeat)
    show(recs)
    return recs


if __name__ == "__main__":
    main()
