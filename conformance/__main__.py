"""`python -m conformance run|bisect|mutate` (see conformance.cli)."""
import sys

from conformance.cli import main

if __name__ == "__main__":
    from conformance.engine.workers import tune_gc

    tune_gc()   # this process is the command's own (its drawing thread allocates as a worker does)
    sys.exit(main())
