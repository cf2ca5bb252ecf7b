"""`python -m xla_backend {info,launch,selftest}`.

info: start JAX on --platform (default XLA_BACKEND_PLATFORM or cpu) with --devices
virtual CPU devices and print the provenance record; exits 1 with the reason when
the platform cannot start or has fewer devices than asked for.
launch: run a command as N local processes (see xla_backend.launch).
selftest: collectives and a reshard across all devices/processes, checked per device.
"""
from __future__ import annotations

import json
import sys

USAGE = (
    "usage: python -m xla_backend info [--platform P] [--devices N] [--hardware]\n"
    "       python -m xla_backend launch --processes 2 --devices-per-process 4 -- COMMAND ...\n"
    "       python -m xla_backend selftest [--distributed] [--json PATH]"
)


def _info(argv) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="python -m xla_backend info")
    ap.add_argument("--platform", default=None, help="cpu, cuda, rocm, tpu or a PJRT plugin name")
    from xla_backend.launch import device_count_arg  # an int in [1, 2**31 - 1], as launch's counts

    ap.add_argument("--devices", type=device_count_arg, default=None,
                    help="CPU: number of virtual devices; other platforms: devices required")
    ap.add_argument("--hardware", action="store_true",
                    help="print the hardware record (device kinds, runtime versions, topology) instead")
    args = ap.parse_args(argv)
    from xla_backend import platform

    try:
        platform.configure(args.platform, args.devices if (args.platform or "cpu") == "cpu" else None)
        platform.require(args.devices)
        from xla_backend import provenance

        record = provenance.hardware() if args.hardware else provenance.info()
        print(json.dumps(record, indent=1, default=list))
    except (platform.PlatformError, ValueError, RuntimeError) as e:
        print(f"xla_backend info: error: {e}", file=sys.stderr)
        return 1
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "info":
        return _info(rest)
    if cmd == "launch":
        from xla_backend.launch import main_launch

        return main_launch(rest)
    if cmd == "selftest":
        from xla_backend.selftest import main as selftest_main

        return selftest_main(rest)
    print(f"unknown command {cmd!r}\n{USAGE}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
