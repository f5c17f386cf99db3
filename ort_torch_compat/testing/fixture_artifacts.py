"""Generate training artifacts with ort_torch_compat for the recorded fixture models.

Needs only onnx, numpy, flatbuffers and this package (no torch, no onnxruntime), so it runs
on any Python onnx supports; CI runs it on Python 3.13 and then trains the result with
onnxruntime-training 1.19.2 on Python 3.11 (``tests/test_artifacts_parity.py``)::

    python scripts/generate_fixture_artifacts.py OUT_DIR [--fixtures tests/fixtures/artifacts] [--only NAME,...]

Each fixture directory (written by ``scripts/make_artifact_fixtures.py``) holds the exported
inference model ``model.onnx`` and, in ``spec.json``, the ``generate_artifacts`` arguments ORT
was given.  ``OUT_DIR/<fixture>/`` receives our four (or five) files.  ``describe_artifacts``
summarizes a directory of artifacts (names, types, shapes, optimizer attributes, checkpoint
digest) the same way for ORT's artifacts (recorded) and ours (tested).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import pathlib
import sys
from typing import Any, Dict, List, Optional

from . import REPO

DEFAULT_FIXTURES = REPO / "tests" / "fixtures" / "artifacts"
MODEL_FILES = ("training_model.onnx", "eval_model.onnx", "optimizer_model.onnx")
CHECKPOINT_FILES = ("checkpoint", "nominal_checkpoint")


def fixture_dirs(root: pathlib.Path = DEFAULT_FIXTURES, only: Optional[List[str]] = None) -> List[pathlib.Path]:
    """Fixture directories (those with model.onnx and spec.json), sorted; ``only`` filters by name."""
    if not root.is_dir():
        return []
    found = sorted(p for p in root.iterdir() if (p / "model.onnx").exists() and (p / "spec.json").exists())
    return [p for p in found if not only or p.name in only]


def generate_for_fixture(fixture: pathlib.Path, out_dir: pathlib.Path) -> pathlib.Path:
    """Run our ``generate_artifacts`` with the fixture's recorded arguments into ``out_dir``.

    The name counter is reset first, so the names are those of a fresh process, which is
    how the fixture's ORT artifacts were made.
    """
    import onnx

    from ort_torch_compat import artifacts, onnxblock

    arguments = json.loads((fixture / "spec.json").read_text())["generate_artifacts"]
    loss = artifacts.LossType[arguments["loss"]] if arguments.get("loss") else None
    optimizer = arguments.get("optimizer")
    if isinstance(optimizer, dict):  # {"AdamW": {"weight_decay": 0.01}}: an onnxblock optimizer block
        ((kind, options),) = optimizer.items()
        optimizer = getattr(onnxblock.optim, kind)(**options)
    elif optimizer:
        optimizer = artifacts.OptimType[optimizer]
    out_dir.mkdir(parents=True, exist_ok=True)
    onnxblock.reset_name_counter()
    artifacts.generate_artifacts(
        onnx.load(str(fixture / "model.onnx")),
        requires_grad=arguments["requires_grad"],
        frozen_params=arguments["frozen_params"],
        loss=loss,
        optimizer=optimizer,
        artifact_directory=str(out_dir),
        **arguments.get("kwargs", {}),
    )
    return out_dir


def _value(info) -> List[Any]:
    tensor = info.type.tensor_type
    if not info.type.HasField("tensor_type"):
        return [info.name, info.type.WhichOneof("value"), None]
    dims = None
    if tensor.HasField("shape"):
        dims = [d.dim_value if d.HasField("dim_value") else (d.dim_param or None) for d in tensor.shape.dim]
    return [info.name, int(tensor.elem_type), dims]


def describe_artifacts(directory: pathlib.Path) -> Dict[str, Any]:
    """What must match between two artifact sets: graph I/O, optimizer node, checkpoint bytes."""
    import onnx

    summary: Dict[str, Any] = {}
    for name in MODEL_FILES:
        path = directory / name
        if not path.exists():
            continue
        graph = onnx.load(str(path)).graph
        entry: Dict[str, Any] = {
            "inputs": [_value(i) for i in graph.input],
            "outputs": [_value(o) for o in graph.output],
        }
        if name == "optimizer_model.onnx":
            entry["nodes"] = [
                [n.domain, n.op_type, sorted((a.name, onnx.helper.get_attribute_value(a)) for a in n.attribute)]
                for n in graph.node
            ]
        summary[name] = entry
    for name in CHECKPOINT_FILES:
        path = directory / name
        if path.exists():
            data = path.read_bytes()
            summary[name] = {"sha256": hashlib.sha256(data).hexdigest(), "bytes": len(data)}
    return json.loads(json.dumps(summary))  # tuples -> lists, as after a JSON round trip


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out_dir")
    parser.add_argument("--fixtures", default=str(DEFAULT_FIXTURES))
    parser.add_argument("--only", help="comma-separated fixture names")
    args = parser.parse_args(argv)
    only = [n for n in (args.only or "").split(",") if n] or None
    fixtures = fixture_dirs(pathlib.Path(args.fixtures), only)
    if not fixtures:
        print(f"no fixtures under {args.fixtures}", file=sys.stderr)
        return 1
    for fixture in fixtures:
        generate_for_fixture(fixture, pathlib.Path(args.out_dir) / fixture.name)
        print(f"generated {fixture.name}", flush=True)
    return 0
