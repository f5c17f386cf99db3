"""`python -m ort_torch_compat ...` is the `ort-torch-compat` command."""

import sys

from .cli import main

if __name__ == "__main__":
    sys.exit(main())
