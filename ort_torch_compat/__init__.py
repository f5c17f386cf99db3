"""ort_torch_compat: ONNX Runtime training artifacts and API, running on PyTorch.

`ort_torch_compat.api` is the drop-in replacement for `onnxruntime.training.api`.
"""

__version__ = "0.1.0"

# The zero-edit switch (stdlib only): `install()` makes `import onnxruntime.training.api` this library.
from .switch import install, is_installed, uninstall  # noqa: E402, F401  (public)

# The C/C#/Objective-C training session surface (OrtTrainingApi), see README's C API section.
# Imported lazily so that `import ort_torch_compat.errors` (or the codec) stays light.
_SESSION_EXPORTS = ("TrainingSession", "load_checkpoint", "load_checkpoint_from_buffer", "save_checkpoint", "set_seed")


def __getattr__(name):
    if name in _SESSION_EXPORTS:
        from . import capi_session

        return getattr(capi_session, name)
    if name == "to_torch_module":  # ORT artifacts as a plain torch.nn.Module (ort_torch_compat.migrate)
        from .migrate import to_torch_module

        return to_torch_module
    if name == "precompile":  # fill the compile cache ahead of time (ort_torch_compat.engine.precompile)
        from .engine.precompile import precompile

        return precompile
    if name == "CheckpointState":
        from .api.checkpoint_state import CheckpointState

        return CheckpointState
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(list(globals()) + list(_SESSION_EXPORTS) + ["CheckpointState", "precompile", "to_torch_module"])
