"""`import ort_torch_compat.api` stays light: onnx, protobuf and onnx2torch load with the
first model, not with the package (docs/design.md, Import time).  Checked by module, not by
timing: a fresh interpreter imports the API and lists what came with it."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("onnx", "onnx2torch", "google.protobuf", "torch.onnx", "torch._dynamo", "torch._inductor")


def test_api_import_leaves_onnx_and_compilers_unloaded():
    code = (
        "import json, sys, torch\nloaded = set(sys.modules)\nimport ort_torch_compat.api\n"
        f"print(json.dumps(sorted(m for m in set(sys.modules) - loaded if m.split('.')[0] in {{'onnx', 'onnx2torch', 'google'}} "
        f"or m in {list(HEAVY)!r})))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == []


def test_first_model_loads_them(tmp_path):
    """The other half: the modules do load when a model is read (so the test above is not vacuous)."""
    code = (
        "import json, sys\nimport ort_torch_compat.api\nfrom ort_torch_compat.engine.model_io import load_model\n"
        "try:\n    load_model(b'not a model', 'training model')\nexcept Exception:\n    pass\n"
        "print(json.dumps('onnx' in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) is True
