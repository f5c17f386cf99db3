"""Record the fixtures of the artifact-generation tests with onnxruntime-training 1.19.2.

For every config: build a tiny torch model, export it (``torch.onnx.export(dynamo=False)``),
give the export to onnxruntime-training's ``generate_artifacts`` (after
``prepare_for_artifacts.prepare_model``, which ORT needs and our generator does not), train
ORT's artifacts with ``ort_torch_compat.testing.scenario.run_scenario`` on
``onnxruntime.training.api`` and write ``tests/fixtures/artifacts/<config>/``::

    model.onnx     the raw export: what our generator is given
    spec.json      generate_artifacts arguments, the scenario spec, and a summary of ORT's
                   artifacts (graph I/O, optimizer node, checkpoint sha256) from
                   ort_torch_compat.testing.fixture_artifacts.describe_artifacts
    expected.npz   what ORT's training of ORT's artifacts recorded

The tests generate our artifacts from model.onnx and compare them with these.  Adding a
model is one line in ``CONFIGS`` of ``ort_torch_compat.testing.artifact_fixtures`` (plus its
family in ``build_model`` if it is new).  Each config runs in its own process: onnxblock's
name counter is process-global.

    python scripts/make_artifact_fixtures.py [--only NAME,...] [--out tests/fixtures/artifacts] [--jobs 2]
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from typing import Any, Dict, List, Optional

from ort_torch_compat.testing import REPO, scenario
from ort_torch_compat.testing import artifact_fixtures as fixtures
from ort_torch_compat.testing import prepare_for_artifacts as prep
from ort_torch_compat.testing import reference_models as reference
from ort_torch_compat.testing.fixture_artifacts import describe_artifacts

DEFAULT_OUT = REPO / "tests" / "fixtures" / "artifacts"


# --------------------------------------------------------------------------- worker
def run_worker(cfg: fixtures.Config, out_root: pathlib.Path) -> Dict[str, Any]:
    stage = "import"
    try:
        import numpy as np
        import onnx
        import onnxruntime
        import torch

        onnxruntime.set_default_logger_severity(3)
        from onnxruntime.training import api as ort_api

        stage = "build and export"
        seed = reference.seed_of(cfg.name)
        torch.manual_seed(seed)
        np.random.seed(seed % 2**32)
        model, args, in_names, out_names, kinds, training, frozen_torch = (
            cfg.build or (lambda loss: fixtures.build_model(cfg.family, loss))
        )(cfg.loss)
        twin = copy.deepcopy(model)  # exporting in training mode updates BatchNorm's running statistics
        exported = fixtures.export_model(
            cfg, model, args, in_names, out_names, training, bool(cfg.extra.get("dynamic_axes"))
        )
        for_ort = exported
        if cfg.extra.get("ort_static_twin"):
            for_ort = fixtures.export_model(cfg, twin, args, in_names, out_names, training, False)
        initializers = [i.name for i in exported.graph.initializer]
        parameters, buffers = dict(model.named_parameters()), dict(model.named_buffers())
        requires_grad = [n for n in initializers if n in parameters and n not in frozen_torch]
        frozen = [
            n
            for n in initializers
            if (n in parameters and n in frozen_torch) or (n in buffers and buffers[n].dtype.is_floating_point)
        ]
        arguments = {
            "requires_grad": requires_grad,
            "frozen_params": frozen,
            "loss": fixtures.LOSS_TYPES[cfg.loss],
            "optimizer": cfg.extra.get("optimizer", {"adamw": "AdamW", "sgd": "SGD"}[cfg.optim]),
            "kwargs": cfg.extra.get("kwargs", {}),
        }

        stage = "onnxruntime-training generate_artifacts"
        target = out_root / cfg.name
        with tempfile.TemporaryDirectory() as tmp:
            ort_dir = pathlib.Path(tmp) / "ort"
            ort_dir.mkdir()
            fixtures.ort_generate(prep.prepare_model(for_ort), arguments, ort_dir)
            stage = "scenario (onnxruntime.training.api)"
            spec = fixtures.scenario_spec(
                cfg, ort_dir, requires_grad + frozen, kinds, arguments, fixtures.concrete_dims(exported, model, args)
            )
            expected = fixtures.run_ort_scenario(ort_api, ort_dir, spec, cfg.extra.get("seed"))
            again = fixtures.run_ort_scenario(ort_api, ort_dir, spec, cfg.extra.get("seed"))
            nondeterministic = scenario.compare(expected, again, rtol=0.0, atol=0.0)
            if nondeterministic:
                raise RuntimeError(f"ORT is not deterministic on this config: {nondeterministic[:3]}")
            summary = describe_artifacts(ort_dir)
        stage = "write fixture"
        if target.exists():
            shutil.rmtree(target)
        target.mkdir(parents=True)
        onnx.save(exported, str(target / "model.onnx"))
        document = {
            "name": cfg.name,
            "generate_artifacts": arguments,
            "scenario": spec,
            "ort_seed": cfg.extra.get("seed"),
            "ort_static_twin": bool(cfg.extra.get("ort_static_twin")),
            "ort_artifacts": summary,
            "versions": {
                "onnxruntime-training": onnxruntime.__version__,
                "onnx": onnx.__version__,
                "torch": torch.__version__,
            },
        }
        (target / "spec.json").write_text(json.dumps(document, indent=1) + "\n")
        reference.save_npz(target / "expected.npz", expected)
        return {
            "name": cfg.name,
            "ok": True,
            "loss_first": float(expected["step1/call1/loss"]),
            "loss_last": float(expected["step5/call1/loss"]),
            "kb": sum(f.stat().st_size for f in target.iterdir()) / 1024,
        }
    except BaseException as exc:  # noqa: BLE001 - reported by the driver
        return {
            "name": cfg.name,
            "ok": False,
            "stage": stage,
            "error": f"{type(exc).__name__}: {exc}",
            "traceback": traceback.format_exc()[-3000:],
        }


# --------------------------------------------------------------------------- driver
def _spawn(name: str, out_root: pathlib.Path) -> Dict[str, Any]:
    command = [sys.executable, str(pathlib.Path(__file__).resolve()), "--worker", name, "--out", str(out_root)]
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONHASHSEED="0")
    done = subprocess.run(command, capture_output=True, text=True, timeout=900, env=env)
    for line in reversed(done.stdout.splitlines()):
        if line.startswith("RESULT "):
            return json.loads(line[len("RESULT ") :])
    return {"name": name, "ok": False, "stage": "worker crashed", "error": done.stderr[-2000:]}


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated config names")
    parser.add_argument("--out", default=str(DEFAULT_OUT))
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--list", action="store_true")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    by_name = {c.name: c for c in fixtures.CONFIGS}
    out_root = pathlib.Path(args.out).resolve()
    if args.list:
        print("\n".join(by_name))
        return 0
    if args.worker:
        print("RESULT " + json.dumps(run_worker(by_name[args.worker], out_root)), flush=True)
        return 0
    names = [n for n in (args.only or "").split(",") if n] or list(by_name)
    unknown = [n for n in names if n not in by_name]
    if unknown:
        parser.error(f"unknown configs {unknown}")
    out_root.mkdir(parents=True, exist_ok=True)
    start = time.time()
    from concurrent.futures import ThreadPoolExecutor

    failed = 0
    with ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for result in pool.map(lambda n: _spawn(n, out_root), names):
            if result["ok"]:
                print(
                    f"[{time.time() - start:6.1f}s] {result['name']}: ok  loss {result['loss_first']:.5f} -> "
                    f"{result['loss_last']:.5f}  {result['kb']:.0f} kB",
                    flush=True,
                )
            else:
                failed += 1
                print(
                    f"[{time.time() - start:6.1f}s] {result['name']}: FAILED at {result['stage']}: "
                    f"{result['error']}\n{result.get('traceback', '')}",
                    flush=True,
                )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
