"""Generate training artifacts with ort_torch_compat for the recorded fixture models.

    python scripts/generate_fixture_artifacts.py OUT_DIR [--fixtures tests/fixtures/artifacts] [--only NAME,...]

The code is ``ort_torch_compat.testing.fixture_artifacts`` (shared with the tests and other scripts).
"""

import sys

from ort_torch_compat.testing.fixture_artifacts import main

if __name__ == "__main__":
    sys.exit(main())
