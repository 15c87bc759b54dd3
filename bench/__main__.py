"""``python -m bench [--quick] [--only NAME,...] [--out DIR]``: run benchmarks, write a report."""

import sys

from bench.suite import main

if __name__ == "__main__":
    sys.exit(main())
