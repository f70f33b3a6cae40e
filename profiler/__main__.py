"""`python -m profiler` == the `epscope` command."""
import sys

from .cli import main

sys.exit(main())
