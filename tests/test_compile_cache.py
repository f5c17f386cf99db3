"""The compile cache trusts nothing it did not verify (engine/compile_cache.py).

Entries here are published by `compile_cache.publish` with stand-in library bytes, then
damaged or planted the ways bad luck and other users do; every one must be refused with a
message naming the file, never loaded, never hang.  A train step that meets one reports it
once, removes it (when it is ours) and compiles again.  (A real compiled entry loading from
a sound cache: tests/test_compiled.py and tests/test_background_compile.py.)
"""

from __future__ import annotations

import json
import os
import pathlib
import threading

import numpy as np
import pytest
import torch

from ort_torch_compat.api import CheckpointState
from ort_torch_compat.engine import (
    TrainingEngine,
    compile_cache,
    compile_key,
    compile_worker,
    compiled,
    compiled_step,
    traced_step,
)
from ort_torch_compat.legacy import SessionOptions
from tests.conftest import FIXTURES

KEY = "0123456789abcdef" * 2
LAYOUT = {
    "num_outputs": 1,
    "mutated": [],
    "index_flag": True,
    "grad_groups": [[1]],
    "trace_constants": [],
    "eager_ms": 2.0,
    "compiled_ms": 1.0,
}


def _publish(root: pathlib.Path, key: str = KEY) -> pathlib.Path:
    def build(scratch: pathlib.Path) -> dict:
        (scratch / "step.so").write_bytes(b"\x7fELF step" * 100)
        (scratch / "step.json").write_bytes(b'{"nodes": []}' * 100)
        return dict(LAYOUT)

    return compile_cache.publish(root, key, build)


def _rewrite_manifest(entry: pathlib.Path, **changes) -> None:
    """Edit the manifest *and* its digest (as a deliberate edit would)."""
    meta = json.loads((entry / "meta.json").read_text())
    meta.update(changes)
    meta["digest"] = compile_cache._manifest_digest(meta)
    (entry / "meta.json").write_text(json.dumps(meta))


def test_a_sound_entry_opens_with_its_manifest(tmp_path):
    entry = _publish(tmp_path)
    opened = compile_cache.open_entry(tmp_path, KEY)
    assert opened.directory == entry and opened.meta["num_outputs"] == 1
    assert set(opened.meta["files"]) == {"step.so", "step.json"}
    assert opened.meta["cpu"] == compile_cache.cpu_features()
    assert compile_cache.open_entry(tmp_path, "f" * 32) is None
    assert oct(os.stat(tmp_path).st_mode & 0o777) != oct(0o777)


def _truncate(entry):
    with open(entry / "step.so", "r+b") as handle:
        handle.truncate(100)


def _flip(entry):
    data = bytearray((entry / "step.json").read_bytes())
    data[len(data) // 2] ^= 0x40
    (entry / "step.json").write_bytes(bytes(data))


def _swap(entry):
    library, extern = (entry / "step.so").read_bytes(), (entry / "step.json").read_bytes()
    (entry / "step.so").write_bytes(extern)
    (entry / "step.json").write_bytes(library)


def _manifest(text):
    return lambda entry: (entry / "meta.json").write_text(text)


def _edit_layout(entry):  # an edit that does not update the digest (a damaged manifest)
    meta = json.loads((entry / "meta.json").read_text())
    meta["grad_groups"] = []
    (entry / "meta.json").write_text(json.dumps(meta))


def _fifo(entry):
    (entry / "meta.json").unlink()
    os.mkfifo(entry / "meta.json")


def _symlink_meta(entry):
    (entry / "meta.json").unlink()
    os.symlink("/dev/zero", entry / "meta.json")


def _symlink_library(entry):
    target = entry.parent / "elsewhere.so"
    target.write_bytes((entry / "step.so").read_bytes())
    (entry / "step.so").unlink()
    os.symlink(target, entry / "step.so")


def _planted(entry):
    (entry / "evil.so").write_bytes(b"\x7fELF")


def _group_writable_entry(entry):
    os.chmod(entry, 0o775)


def _world_writable_file(entry):
    os.chmod(entry / "step.so", 0o666)


def _other_isa(entry):
    _rewrite_manifest(entry, cpu=compile_cache.cpu_features() + ["avx_from_the_future"])


def _other_key(entry):
    _rewrite_manifest(entry, key="f" * 32)


TAMPERS = {
    "truncated library": (_truncate, "SHA-256"),
    "flipped byte": (_flip, "SHA-256"),
    "swapped libraries": (_swap, "SHA-256"),
    "manifest {}": (_manifest("{}"), "digest"),
    "manifest 1": (_manifest("1"), "digest"),
    "manifest text": (_manifest("text"), "not valid JSON"),
    "truncated manifest": (_manifest('{"num_outputs": 1, "mut'), "not valid JSON"),
    "edited manifest": (_edit_layout, "digest"),
    "manifest FIFO": (_fifo, "not a regular file"),
    "manifest symlink to /dev/zero": (_symlink_meta, "cannot be opened"),
    "library symlink": (_symlink_library, "not a regular file"),
    "planted file": (_planted, "evil.so"),
    "group-writable entry": (_group_writable_entry, "chmod go-w"),
    "world-writable library": (_world_writable_file, "chmod go-w"),
    "compiled for another CPU": (_other_isa, "avx_from_the_future"),
    "entry of another key": (_other_key, "moved or copied"),
}


@pytest.mark.parametrize("tamper", TAMPERS, ids=list(TAMPERS))
def test_a_damaged_or_planted_entry_is_refused(tmp_path, tamper):
    action, message = TAMPERS[tamper]
    entry = _publish(tmp_path)
    action(entry)
    outcome = {}

    def open_it():
        try:
            compile_cache.open_entry(tmp_path, KEY)
        except compile_cache.CacheProblem as problem:
            outcome["problem"] = str(problem)

    reader = threading.Thread(target=open_it, daemon=True)
    reader.start()
    reader.join(timeout=10)
    assert not reader.is_alive(), "opening the entry hung"
    assert message in outcome.get("problem", "accepted"), outcome
    assert compile_cache.discard(tmp_path, KEY)
    assert not os.path.lexists(entry) and compile_cache.open_entry(tmp_path, KEY) is None


def test_an_entry_moved_under_another_key_is_refused(tmp_path):
    """The batch-32 entry put under the batch-16 key: its manifest names its own key."""
    entry = _publish(tmp_path)
    os.rename(entry, tmp_path / ("f" * 32))
    with pytest.raises(compile_cache.CacheProblem, match="moved or copied"):
        compile_cache.open_entry(tmp_path, "f" * 32)


@pytest.mark.skipif(os.getuid() != 0, reason="changing a file's owner needs root")
def test_an_entry_of_another_user_is_refused_and_left_alone(tmp_path):
    entry = _publish(tmp_path)
    os.chown(entry, 12345, 12345)
    with pytest.raises(compile_cache.CacheProblem, match="owned by another user"):
        compile_cache.open_entry(tmp_path, KEY)
    assert not compile_cache.discard(tmp_path, KEY) and entry.exists()


def test_a_shared_writable_cache_root_is_refused(tmp_path):
    root = tmp_path / "compiled"
    root.mkdir()
    os.chmod(root, 0o1777)
    with pytest.raises(compile_cache.CacheProblem, match="chmod go-w"):
        compile_cache.check_root(root)
    with pytest.raises(compile_cache.CacheProblem, match="chmod go-w"):
        _publish(root)


def _engine(tmp_path, monkeypatch) -> TrainingEngine:
    monkeypatch.setenv(compile_cache.CACHE_ENV, str(tmp_path))
    monkeypatch.setattr(compiled, "_reported", set())
    monkeypatch.setattr(compiled, "cxx_compiler", lambda: "c++")
    monkeypatch.setattr(traced_step, "torchscript_available", lambda: False)  # the cache alone: eager or compiled
    directory = FIXTURES / "mlp_mse_adamw_op17"
    options = SessionOptions()
    options.add_session_config_entry(compiled.CONFIG_KEY, "auto")
    state = CheckpointState.load_checkpoint(directory / "checkpoint")
    return TrainingEngine(state._state, str(directory / "training_model.onnx"), session_options=options)


class _NeverDone:
    """A worker that never finishes (told to go, it goes on compiling)."""

    def go(self, priority):
        pass

    def done(self):
        return False


def _inputs(engine) -> list:
    return [
        torch.from_numpy(
            np.ones(
                [d if isinstance(d, int) else 8 for d in spec.shape],
                dtype=np.float32 if spec.elem_type == 1 else np.int64,
            )
        )
        for spec in engine.train_io.user_inputs
    ]


def _first_step(engine) -> None:
    engine.train_step(_inputs(engine))


def test_a_train_step_removes_a_damaged_entry_and_compiles_again(tmp_path, monkeypatch):
    engine = _engine(tmp_path, monkeypatch)
    started = []
    monkeypatch.setattr(compile_worker, "start", lambda *a, **k: started.append(1) or _NeverDone())
    monkeypatch.setattr(compiled_step, "CompiledTrainStep", lambda *a: pytest.fail("a damaged entry was loaded"))
    key = compile_key.graph_key(engine.train_module, engine.train_tensors(_inputs(engine)))
    entry = _publish(tmp_path / "compiled", key)
    _flip(entry)
    with pytest.warns(compiled.CompileWarning, match="removed and is compiled again"):
        _first_step(engine)
    assert started == [1] and not entry.exists() and engine.train_runner.path == "compiling"


def test_a_train_step_in_an_untrusted_cache_runs_eagerly_and_says_how_to_fix_it(tmp_path, monkeypatch):
    engine = _engine(tmp_path, monkeypatch)
    root = tmp_path / "compiled"
    root.mkdir()
    os.chmod(root, 0o777)
    monkeypatch.setattr(compile_worker, "start", lambda *a, **k: pytest.fail("compiled into an untrusted cache"))
    with pytest.warns(compiled.CompileWarning, match="chmod go-w"):
        _first_step(engine)
    assert engine.train_runner.path == "eager"
