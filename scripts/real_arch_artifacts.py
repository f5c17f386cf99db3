"""Export one real-architecture recipe and make ORT's training artifacts from it.

    python scripts/real_arch_artifacts.py resnet18 OUT_DIR [--opset 17] [--export train] [--stats frozen] [--optimizer adamw] [--size test] [--nominal]

The code is ``ort_torch_compat.testing.real_arch_artifacts`` (shared with the tests and other scripts).
"""

import sys

from ort_torch_compat.testing.real_arch_artifacts import main

if __name__ == "__main__":
    sys.exit(main())
