"""Make a ``torch.onnx.export`` model acceptable to onnxruntime-training 1.19.2.

    python scripts/prepare_for_artifacts.py in.onnx out.onnx [--ir-version 10] [--eval]

The code is ``ort_torch_compat.testing.prepare_for_artifacts`` (shared with the tests and other scripts).
"""

import sys

from ort_torch_compat.testing.prepare_for_artifacts import main

if __name__ == "__main__":
    sys.exit(main())
