"""`import ort_torch_compat.api` stays light: onnx, protobuf, onnx2torch and ml_dtypes load
with the first model (or ml_dtypes with the first bfloat16 or float8 tensor), not with the
package (docs/design.md, Import time).  Checked by module, not by
timing: a fresh interpreter imports the API and lists what came with it."""

from __future__ import annotations

import json
import subprocess
import sys

HEAVY = ("onnx", "onnx2torch", "google.protobuf", "torch.onnx", "torch._dynamo", "torch._inductor", "ml_dtypes")


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


def test_ml_dtypes_types_work_from_either_side_in_a_fresh_process():
    """The codec's bfloat16/float8 map fills itself from ml_dtypes when a code asks for such
    a type, or when an array of one (so ml_dtypes is loaded) asks for its code."""
    code = (
        "import json, sys\nfrom ort_torch_compat.codec import dtypes\n"
        "by_code = str(dtypes.numpy_dtype(16)), 'ml_dtypes' in sys.modules\n"  # 16: BFLOAT16
        "print(json.dumps(by_code))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == ["bfloat16", True]
    code = (
        "import json, ml_dtypes, numpy\nfrom ort_torch_compat.codec import dtypes\n"
        "print(json.dumps(dtypes.code_from_numpy(numpy.zeros(2, ml_dtypes.float8_e5m2).dtype)))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout.strip().splitlines()[-1]) == 19  # FLOAT8E5M2
