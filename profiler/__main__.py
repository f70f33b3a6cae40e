"""`python -m profiler` == the `epscope` command."""
import sys

from .commands.cli import main

if __name__ == "__main__":          # not again in a worker process that imports the main module (Dask's)
    sys.exit(main())
