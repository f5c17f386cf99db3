"""The zero-edit switch: `import onnxruntime.training.api` resolves to `ort_torch_compat.api`.

`install()` puts one finder at the front of `sys.meta_path`.  It answers only for:

* `onnxruntime.training`: a small package module of ours (the real one needs ORT's
  training build).  Its `api` is ours; its other submodules load from the real
  onnxruntime-training when that is installed.  Without it, `artifacts` and `onnxblock`
  are ours (`ort_torch_compat.artifacts` / `ort_torch_compat.onnxblock`, which need
  neither torch nor ONNX Runtime) and the rest (`ortmodule`, `optim`, ...) raise an
  ImportError saying they need the real package.
* `onnxruntime.training.api` and `onnxruntime.training.api.<submodule>`: proxy modules
  whose attributes are those of `ort_torch_compat.api` (the same class objects); likewise
  `onnxruntime.training.artifacts` and `onnxruntime.training.onnxblock[.<submodule>]` when
  the real ones are absent.
* `onnxruntime`, only when no real onnxruntime can be found: a stub package with
  `OrtValue` (ours), `training`, `get_device()` and `get_available_providers()` (from
  torch's devices), and the legacy `TrainingSession` / `TrainingParameters` /
  `SessionOptions` (ort_torch_compat.legacy).  Anything else,
  `InferenceSession` included, raises an error saying onnxruntime is not installed.
  When the real package is installed the finder stays out of its way, so
  `onnxruntime.InferenceSession` and `onnxruntime.OrtValue` are ORT's.

Nothing is deleted from or replaced in `sys.modules` by `install()`; a module imported
before `install()` stays what it is (a warning says so for `onnxruntime.training.api`).
`uninstall()` removes the finder and the modules it created.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
import threading
import types
import warnings
from typing import List, Optional, Sequence

__all__ = ["install", "uninstall", "is_installed", "STUB_VERSION"]

ROOT = "onnxruntime"
TRAINING = "onnxruntime.training"
API = "onnxruntime.training.api"
TARGET = "ort_torch_compat.api"
# Offline tooling that is ours only where onnxruntime-training is not installed.
TOOLING_TARGETS = {
    "onnxruntime.training.artifacts": "ort_torch_compat.artifacts",
    "onnxruntime.training.onnxblock": "ort_torch_compat.onnxblock",
}
STUB_VERSION = "1.19.2+ort_torch_compat"
_MARK = "__ort_torch_compat_switch__"

# Submodules of the real onnxruntime.training that `onnxruntime.training.<name>` attribute
# access may import (the real package imports several of them eagerly).
_TRAINING_SUBMODULES = ("api", "artifacts", "onnxblock", "optim", "amp", "ortmodule", "experimental", "utils")

_NEEDS_REAL_TRAINING = (
    "{name} needs the real onnxruntime-training package, which is not installed: "
    "ort_torch_compat replaces onnxruntime.training.api (training), .artifacts and .onnxblock "
    "(making artifacts) only; use PyTorch itself for what ORTModule, onnxruntime.training.optim and amp did."
)
_NEEDS_REAL_ORT = (
    "{name} is not available: onnxruntime is not installed and ort_torch_compat's stand-in "
    "provides only onnxruntime.training.api and onnxruntime.OrtValue (pip install onnxruntime for inference)"
)


def _is_ours(module: object) -> bool:
    return isinstance(module, types.ModuleType) and module.__dict__.get(_MARK, False)


class _ProxyModule(types.ModuleType):
    """A module whose attributes are read from another module (`ort_torch_compat.api...`)."""

    def __init__(self, name: str, target: types.ModuleType):
        super().__init__(name, target.__doc__)
        self.__dict__[_MARK] = True
        self.__dict__["_target"] = target
        if hasattr(target, "__all__"):
            self.__dict__["__all__"] = list(target.__all__)

    def __getattr__(self, attribute: str):
        if attribute.startswith("__") and attribute.endswith("__"):
            raise AttributeError(attribute)  # module machinery (__path__, __file__...) stays ours
        return getattr(self.__dict__["_target"], attribute)

    def __dir__(self) -> List[str]:
        return sorted(set(super().__dir__()) | set(dir(self.__dict__["_target"])))

    def __repr__(self) -> str:
        return f"<module {self.__name__!r} (ort_torch_compat switch -> {self.__dict__['_target'].__name__!r})>"


class _TrainingModule(types.ModuleType):
    """Our `onnxruntime.training`: `api` is ort_torch_compat's, the rest is the real package's."""

    def __getattr__(self, attribute: str):
        if attribute.startswith("__") and attribute.endswith("__"):
            raise AttributeError(attribute)
        if attribute in _TRAINING_SUBMODULES:
            try:
                return importlib.import_module(f"{self.__name__}.{attribute}")
            except ImportError as error:
                raise AttributeError(str(error)) from error
        raise AttributeError(f"module {self.__name__!r} (ort_torch_compat switch) has no attribute {attribute!r}")

    def __repr__(self) -> str:
        return f"<module {self.__name__!r} (ort_torch_compat switch)>"


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


def get_available_providers() -> List[str]:
    """What the torch engine can run on, in ORT's provider names."""
    return (["CUDAExecutionProvider"] if _cuda_available() else []) + ["CPUExecutionProvider"]


def get_device() -> str:
    return "GPU" if _cuda_available() else "CPU"


_STUB_ATTRIBUTES = {"get_available_providers": get_available_providers, "get_device": get_device}
# The legacy (1.10-era) training API lived at the top of onnxruntime.
_STUB_LEGACY = ("SessionOptions", "TrainingSession", "TrainingParameters")


class _StubRoot(types.ModuleType):
    """`onnxruntime` when it is not installed: `OrtValue`, `training`, `__version__`,
    `get_device()`, `get_available_providers()` (mapped to torch's devices), and the legacy
    `TrainingSession`, `TrainingParameters`, `SessionOptions` (ort_torch_compat.legacy)."""

    def __getattr__(self, attribute: str):
        if attribute == "OrtValue":
            from .api.ortvalue import OrtValue

            return OrtValue
        if attribute == "training":
            return importlib.import_module(TRAINING)
        if attribute in _STUB_ATTRIBUTES:
            return _STUB_ATTRIBUTES[attribute]
        if attribute in _STUB_LEGACY:
            return getattr(importlib.import_module("ort_torch_compat.legacy"), attribute)
        if attribute.startswith("__"):
            raise AttributeError(attribute)
        raise AttributeError(_NEEDS_REAL_ORT.format(name=f"onnxruntime.{attribute}"))

    def __dir__(self) -> List[str]:
        extra = {"OrtValue", "training"} | set(_STUB_ATTRIBUTES) | set(_STUB_LEGACY)
        return sorted(set(super().__dir__()) | extra)

    def __repr__(self) -> str:
        return "<module 'onnxruntime' (ort_torch_compat stand-in; onnxruntime is not installed)>"


class _Loader(importlib.abc.Loader):
    """Creates the switch's modules; they have no code to execute."""

    def __init__(self, finder: "SwitchFinder", kind: str, target: Optional[str] = None):
        self.finder = finder
        self.kind = kind
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        if self.kind == "proxy":
            module: types.ModuleType = _ProxyModule(spec.name, importlib.import_module(self.target))
        elif self.kind == "training":
            module = _TrainingModule(spec.name, "onnxruntime.training, as provided by ort_torch_compat's switch.")
            module.__dict__[_MARK] = True
        else:
            module = _StubRoot(spec.name, "Stand-in for onnxruntime, provided by ort_torch_compat's switch.")
            module.__dict__[_MARK] = True
            module.__dict__["__version__"] = STUB_VERSION
        self.finder.created.append(module)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        if self.kind == "training":
            module.__path__ = self.finder.real_training_path()


class SwitchFinder(importlib.abc.MetaPathFinder):
    def __init__(self) -> None:
        self.created: List[types.ModuleType] = []
        self._local = threading.local()

    # ---- what the rest of the meta path would find ------------------------------------
    def _others_find(self, fullname: str, path: Optional[Sequence[str]]) -> Optional[importlib.machinery.ModuleSpec]:
        if getattr(self._local, "busy", False):
            return None
        self._local.busy = True
        try:
            for finder in list(sys.meta_path):
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                try:
                    spec = finder.find_spec(fullname, path, None)
                except ImportError:
                    return None  # a finder that blocks the name: treat it as not installed
                if spec is not None:
                    return spec
            return None
        finally:
            self._local.busy = False

    def real_training_path(self) -> List[str]:
        root = sys.modules.get(ROOT)
        if root is None or _is_ours(root):
            return []
        return [
            os.path.join(p, "training")
            for p in getattr(root, "__path__", []) or []
            if os.path.isdir(os.path.join(p, "training"))
        ]

    # ---- the finder ------------------------------------------------------------------
    def find_spec(self, fullname, path=None, target=None):
        if fullname == ROOT:
            if self._others_find(fullname, path) is not None:
                return None  # the real onnxruntime: leave it alone
            return importlib.util.spec_from_loader(fullname, _Loader(self, "root"), is_package=True)
        if not fullname.startswith(ROOT + "."):
            return None
        if fullname == TRAINING:
            return importlib.util.spec_from_loader(fullname, _Loader(self, "training"), is_package=True)
        if fullname == API or fullname.startswith(API + "."):
            target_name = TARGET + fullname[len(API) :]
            if fullname != API and importlib.util.find_spec(target_name) is None:
                return None
            is_package = fullname == API
            spec = importlib.util.spec_from_loader(fullname, _Loader(self, "proxy", target_name), is_package=is_package)
            return spec
        if fullname.startswith(TRAINING + "."):
            if self._others_find(fullname, path) is not None:
                return None  # the real onnxruntime-training's artifacts, onnxblock...
            top = ".".join(fullname.split(".")[:3])
            if top in TOOLING_TARGETS:
                return self._tooling_spec(fullname, TOOLING_TARGETS[top] + fullname[len(top) :])
            raise ImportError(_NEEDS_REAL_TRAINING.format(name=top), name=fullname)
        if _is_ours(sys.modules.get(ROOT)):
            raise ImportError(_NEEDS_REAL_ORT.format(name=fullname), name=fullname)
        return None

    def _tooling_spec(self, fullname: str, target_name: str) -> Optional[importlib.machinery.ModuleSpec]:
        """A proxy for ``ort_torch_compat.artifacts`` / ``.onnxblock`` (or one of their submodules)."""
        target = importlib.util.find_spec(target_name)
        if target is None:
            return None
        loader = _Loader(self, "proxy", target_name)
        return importlib.util.spec_from_loader(
            fullname, loader, is_package=target.submodule_search_locations is not None
        )

    def invalidate_caches(self) -> None:
        pass


_FINDER = SwitchFinder()
_LOCK = threading.Lock()


def is_installed() -> bool:
    return _FINDER in sys.meta_path


def install() -> None:
    """Make `onnxruntime.training.api` (and `from onnxruntime.training.api import ...`) this library.

    Idempotent.  Call it before the script imports onnxruntime.training.api (a module
    already imported keeps its implementation, and a RuntimeWarning says so).
    """
    with _LOCK:
        if _FINDER in sys.meta_path:
            return
        existing = sys.modules.get(API)
        if existing is not None and not _is_ours(existing):
            warnings.warn(
                "onnxruntime.training.api was imported before ort_torch_compat.install(); code holding that module "
                "keeps using onnxruntime-training. Call install() before importing it.",
                RuntimeWarning,
                stacklevel=2,
            )
        sys.meta_path.insert(0, _FINDER)


def uninstall() -> None:
    """Remove the finder and every module it created (from sys.modules and their parents)."""
    with _LOCK:
        while _FINDER in sys.meta_path:
            sys.meta_path.remove(_FINDER)
        created, _FINDER.created = _FINDER.created, []
        for module in created:
            name = module.__name__
            if sys.modules.get(name) is module:
                del sys.modules[name]
            parent_name, _, child = name.rpartition(".")
            parent = sys.modules.get(parent_name) if parent_name else None
            if parent is not None and parent.__dict__.get(child) is module:
                delattr(parent, child)
