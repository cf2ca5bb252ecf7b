"""`python -m conformance run|bisect|mutate` (see conformance.cli)."""
import sys

from conformance.cli import main

if __name__ == "__main__":
    sys.exit(main())
