"""The zero-edit switch: onnxruntime.training.api -> ort_torch_compat.api."""

from __future__ import annotations

import importlib
import importlib.util
import os
import pathlib
import runpy
import site
import subprocess
import sys

import numpy as np
import pytest

import ort_torch_compat
import ort_torch_compat.api as ours
from ort_torch_compat import switch
from ort_torch_compat.cli import main

ROOT = pathlib.Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "examples" / "ort_script.py"
_MISSING = object()


def _ort_modules():
    return {k: v for k, v in sys.modules.items() if k == "onnxruntime" or k.startswith("onnxruntime.")}


@pytest.fixture
def isolated(monkeypatch):
    """Hide already-imported onnxruntime.training modules for the test; restore everything after."""
    saved = _ort_modules()
    root = saved.get("onnxruntime")
    root_training = root.__dict__.get("training", _MISSING) if root is not None else _MISSING
    for name in saved:
        if name.startswith("onnxruntime.training"):
            del sys.modules[name]
    yield saved
    switch.uninstall()
    for name in list(_ort_modules()):
        if name not in saved:
            del sys.modules[name]
    sys.modules.update(saved)
    if root is not None:
        if root_training is _MISSING:
            root.__dict__.pop("training", None)
        else:
            root.training = root_training


class _Blocker:
    """A meta path finder that makes onnxruntime look uninstalled."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname == "onnxruntime" or fullname.startswith("onnxruntime."):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)
        return None


def test_install_redirects_api_and_keeps_real_onnxruntime(isolated):
    real = importlib.util.find_spec("onnxruntime") is not None
    ort_torch_compat.install()
    ort_torch_compat.install()  # idempotent
    assert sum(f is switch._FINDER for f in sys.meta_path) == 1
    import onnxruntime.training.api as api
    from onnxruntime.training.api import CheckpointState, LinearLRScheduler, Module, Optimizer
    from onnxruntime.training.api.checkpoint_state import CheckpointState as FromSubmodule

    assert (CheckpointState, Module, Optimizer, LinearLRScheduler) == (
        ours.CheckpointState,
        ours.Module,
        ours.Optimizer,
        ours.LinearLRScheduler,
    )
    assert FromSubmodule is ours.CheckpointState
    assert set(api.__all__) >= {"CheckpointState", "Module", "Optimizer", "LinearLRScheduler"}
    import onnxruntime

    if real:  # the inference package is untouched
        assert "ort_torch_compat" not in repr(onnxruntime)
        assert onnxruntime.InferenceSession.__module__.startswith("onnxruntime.")
        assert onnxruntime.OrtValue.__module__.startswith("onnxruntime.")
    assert onnxruntime.training.api is api
    from importlib import metadata

    from onnxruntime.training import artifacts  # the real one when onnxruntime-training is installed

    try:
        metadata.distribution("onnxruntime-training")
        expected = "onnxruntime.training.artifacts"
    except metadata.PackageNotFoundError:
        expected = "ort_torch_compat.artifacts.generate"
    assert artifacts.generate_artifacts.__module__ == expected

    switch.uninstall()
    assert not switch.is_installed()
    assert "onnxruntime.training.api" not in sys.modules
    assert "onnxruntime.training" not in sys.modules


def test_stub_when_onnxruntime_is_missing(isolated, monkeypatch):
    for name in list(sys.modules):
        if name == "onnxruntime" or name.startswith("onnxruntime."):
            del sys.modules[name]
    monkeypatch.setattr(sys, "meta_path", [_Blocker()] + sys.meta_path)
    with pytest.raises(ImportError):
        importlib.import_module("onnxruntime")
    switch.install()
    import onnxruntime
    from onnxruntime.training.api import Module

    assert Module is ours.Module
    assert onnxruntime.OrtValue is ours.OrtValue
    assert onnxruntime.__version__.startswith("1.19.2")
    assert "CPUExecutionProvider" in onnxruntime.get_available_providers()
    from ort_torch_compat import legacy

    assert onnxruntime.TrainingSession is legacy.TrainingSession  # the 1.10-era API lived here
    assert isinstance(onnxruntime.SessionOptions(), legacy.SessionOptions)
    import onnxruntime.training.onnxblock
    from onnxruntime.training import artifacts  # without onnxruntime-training: ours
    from onnxruntime.training.onnxblock.loss import MSELoss

    import ort_torch_compat.artifacts
    import ort_torch_compat.onnxblock

    assert artifacts.generate_artifacts is ort_torch_compat.artifacts.generate_artifacts
    assert onnxruntime.training.onnxblock.Block is ort_torch_compat.onnxblock.Block
    assert MSELoss is ort_torch_compat.onnxblock.loss.MSELoss
    with pytest.raises(ImportError, match="needs the real onnxruntime-training"):
        import onnxruntime.training.ortmodule  # noqa: F401
    with pytest.raises(ImportError, match="onnxruntime is not installed"):
        from onnxruntime import InferenceSession  # noqa: F401
    switch.uninstall()
    assert "onnxruntime" not in sys.modules


def test_warns_when_real_api_was_imported_first(isolated):
    real_api = pytest.importorskip("onnxruntime.training.api")
    if switch._is_ours(real_api):
        pytest.skip("not the real package")
    with pytest.warns(RuntimeWarning, match="before ort_torch_compat.install"):
        switch.install()


def _isolated_run(argv, cwd=None):
    """Run `main(argv)` like a fresh interpreter would see argv/path, restoring them after."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    try:
        return main(argv)
    finally:
        sys.argv[:], sys.path[:] = saved_argv, saved_path


def test_run_gives_script_its_argv_main_and_exit_code(tmp_path, isolated):
    script = tmp_path / "probe.py"
    script.write_text(
        "import json, sys\n"
        "import onnxruntime.training.api as api\n"
        "json.dump({'argv': sys.argv, 'name': __name__, 'api': api.Module.__module__},"
        " open(sys.argv[1], 'w'))\n"
        "sys.exit(int(sys.argv[2]))\n"
    )
    out = tmp_path / "out.json"
    with pytest.raises(SystemExit) as exit_:
        _isolated_run(["run", str(script), str(out), "5", "--flag"])
    assert exit_.value.code == 5
    import json

    seen = json.loads(out.read_text())
    assert seen == {
        "argv": [str(script), str(out), "5", "--flag"],
        "name": "__main__",
        "api": "ort_torch_compat.api.module",
    }
    with pytest.raises(SystemExit) as exit_:
        _isolated_run(["run", str(script), str(out), "0"])
    assert exit_.value.code == 0


def test_run_usage_and_subprocess_exit_code(tmp_path):
    assert main(["run"]) == 2
    assert main(["run", str(tmp_path / "missing.py")]) == 1
    script = tmp_path / "exit.py"
    script.write_text("import sys\nprint('hello', sys.argv[1:])\nsys.exit(7)\n")
    result = subprocess.run(
        [sys.executable, "-m", "ort_torch_compat", "run", str(script), "a", "-b"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 7 and "hello ['a', '-b']" in result.stdout


def _results(directory: pathlib.Path):
    return dict(np.load(directory / "results.npz"))


def _compare(a, b):
    assert sorted(a) == sorted(b)
    for key in a:
        np.testing.assert_allclose(
            a[key].astype(np.float64), b[key].astype(np.float64), rtol=1e-5, atol=1e-5, err_msg=key
        )


def _environment_without_onnxruntime(tmp_path: pathlib.Path) -> pathlib.Path:
    """A directory mirroring site-packages minus onnxruntime(-training): `python -S` sees no ORT."""
    mirror = tmp_path / "site-packages-without-onnxruntime"
    mirror.mkdir()
    for directory in site.getsitepackages():
        if not os.path.isdir(directory):
            continue
        for entry in os.listdir(directory):
            lowered = entry.lower()
            if lowered.startswith("onnxruntime") or entry.endswith(".pth") or entry.startswith("__editable__"):
                continue
            if not (mirror / entry).exists():
                (mirror / entry).symlink_to(os.path.join(directory, entry))
    return mirror


def test_ort_script_runs_unmodified_without_onnxruntime_training(tmp_path, isolated):
    """examples/ort_script.py: ORT itself, the switch next to real onnxruntime, and no ORT at all."""
    runs = {}
    if importlib.util.find_spec("onnxruntime") is not None:
        try:
            importlib.import_module("onnxruntime.training.api")
            has_ort_training = True
        except ImportError:
            has_ort_training = False
        if has_ort_training:  # the reference: the script under onnxruntime-training itself
            saved_argv = sys.argv[:]
            sys.argv = [str(SCRIPT), "--out", str(tmp_path / "ort")]
            try:
                with pytest.raises(SystemExit) as exit_:
                    runpy.run_path(str(SCRIPT), run_name="__main__")
            finally:
                sys.argv = saved_argv
            assert exit_.value.code == 0
            runs["ort"] = _results(tmp_path / "ort")
            for name in list(sys.modules):  # let the switch provide onnxruntime.training next
                if name.startswith("onnxruntime.training"):
                    del sys.modules[name]

    # The switch next to a real onnxruntime (inference package): OrtValues are ORT's.
    with pytest.raises(SystemExit) as exit_:
        _isolated_run(["run", str(SCRIPT), "--out", str(tmp_path / "switch")])
    assert exit_.value.code == 0
    runs["switch"] = _results(tmp_path / "switch")

    # No onnxruntime installed at all, through the console entry point's module.
    mirror = _environment_without_onnxruntime(tmp_path)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(mirror), str(ROOT)]), OMP_NUM_THREADS="1")
    probe = subprocess.run(
        [sys.executable, "-S", "-c", "import onnxruntime"], env=env, capture_output=True, text=True, timeout=60
    )
    assert probe.returncode != 0 and "No module named 'onnxruntime'" in probe.stderr
    result = subprocess.run(
        [
            sys.executable,
            "-S",
            "-m",
            "ort_torch_compat",
            "run",
            str(SCRIPT),
            "--out",
            str(tmp_path / "stub"),
            "--exit-code",
            "3",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        cwd=tmp_path,
    )
    assert result.returncode == 3, result.stderr[-3000:]
    assert "eval loss" in result.stdout
    runs["stub"] = _results(tmp_path / "stub")

    reference = runs.pop("ort", None) or runs["switch"]
    for run in runs.values():
        _compare(run, reference)
