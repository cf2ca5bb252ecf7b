"""`python -m conformance.debug FILE.py[:NAME]`: the bisect command (also `python -m conformance bisect`)."""
import sys

from xla_backend import platform

if __name__ == "__main__":
    import os

    # Reproducers name device ids up to their mesh size; give the CPU platform 8 devices unless told.
    platform.configure(os.environ.get("XLA_BACKEND_PLATFORM", "cpu"), int(os.environ.get("XLA_BACKEND_DEVICES", "8")))
    from conformance.debug.cli import main

    sys.exit(main(sys.argv[1:]))
