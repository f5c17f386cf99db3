"""Shared scenario and referee code of this repository's test suite and scripts; not public API.

The tests (``tests/``) and the fixture, benchmark and measurement scripts (``scripts/``) import
these modules as ``ort_torch_compat.testing.<module>``: the training scenarios replayed on ONNX
Runtime and on this library, the parity rule that judges them, the fixture cases, and the
model builders of the real-architecture fixtures.  Nothing in ``ort_torch_compat`` imports
this package, no module here imports pytest, and the modules read fixtures from the checkout
the package is installed from (``pip install -e .``): ``REPO``.  Heavy optional dependencies
(onnxruntime-training, transformers, torchvision) are imported inside the functions that need
them.
"""

import pathlib

#: The repository checkout (an editable install's source tree): tests/fixtures/, examples/, scripts/.
REPO = pathlib.Path(__file__).resolve().parents[2]
