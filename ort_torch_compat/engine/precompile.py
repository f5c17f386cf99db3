"""Compiling train steps ahead of time, so that an app's first step already runs compiled.

`precompile` builds the training engine for the artifacts, makes one batch of the given
input shapes (values do not matter for the cache key: normal floats, ones for integers and
booleans, "1" for strings), and compiles, checks, times and caches the step exactly as
the background compile does (`compile_build.build_entry`), in this process.  Run it at install
or build time on the machine (or one of the same CPU and torch) that will train; the
`ort-torch-compat compile` command wraps it.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass
from typing import Dict, Mapping, Optional, Sequence, Union

import numpy as np

from ..errors import InvalidArgumentError
from . import compile_build, compile_cache, compile_key, compiled
from .checkpoint_io import load_state
from .compile_cache import cache_root
from .io_spec import tensor_from_array
from .training_engine import TrainingEngine

PathLike = Union[str, "os.PathLike[str]"]


@dataclass
class PrecompileResult:
    """What `precompile` did: status "compiled", "cached" (the entry was there already),
    "refused" (the graph cannot be compiled; it trains eagerly) or "failed" (the compiler
    failed: the reason names it)."""

    status: str
    directory: str
    reason: str = ""
    seconds: float = 0.0


class _CompileOff:
    """Session options for the engine that only hosts the graph here: no compiling of its own."""

    intra_op_num_threads = 0
    graph_optimization_level = 99

    @staticmethod
    def get_session_config_entry(key: str) -> Optional[str]:
        return "off" if key == compiled.CONFIG_KEY else None


def _example(shape: Sequence[int], dtype: "np.dtype") -> np.ndarray:
    if dtype.kind == "f":
        return np.random.default_rng(0).standard_normal(tuple(shape)).astype(dtype)
    if dtype.kind == "O":
        return np.full(tuple(shape), "1", dtype=object)
    return np.ones(tuple(shape), dtype=dtype)


def precompile(
    training_model: PathLike,
    checkpoint: PathLike,
    shapes: Mapping[str, Sequence[int]],
    dtypes: Optional[Mapping[str, str]] = None,
    gradients: str = "ort",
) -> PrecompileResult:
    """Fill the compile cache for the train step of `training_model` fed inputs of `shapes`
    (input name -> shape; every user input of the model must be named), with `dtypes`
    (input name -> numpy dtype name) where the model does not declare one.  Set
    ORT_TORCH_COMPAT_CACHE_DIR to fill another cache than the default one."""
    if compiled.cxx_compiler() is None:
        raise InvalidArgumentError("no C++ compiler found (g++, c++ or clang++; or set CXX): nothing can be compiled")
    engine = TrainingEngine(
        load_state(checkpoint), os.fspath(training_model), gradients=gradients, session_options=_CompileOff()
    )
    declared = engine.train_io.user_inputs
    dtypes = dict(dtypes or {})
    unknown = sorted((set(shapes) | set(dtypes)) - {spec.name for spec in declared})
    missing = [spec.name for spec in declared if spec.name not in shapes]
    if unknown or missing:
        raise InvalidArgumentError(
            f"the training model's inputs are {[spec.name for spec in declared]}: "
            + (f"unknown input(s) {unknown}" if unknown else "")
            + ("; " if unknown and missing else "")
            + (f"give a shape for {missing}" if missing else "")
        )
    inputs = []
    for spec in declared:
        if spec.name in dtypes:
            dtype = np.dtype(dtypes[spec.name])
        elif spec.dtype is not None:
            dtype = np.dtype(str(spec.dtype).replace("torch.", ""))
        else:  # a string input
            dtype = np.dtype(object)
        example = _example(shapes[spec.name], dtype)
        inputs.append(example if dtype.kind == "O" else tensor_from_array(example))
    tensors = engine.train_tensors(inputs)
    key = compile_key.graph_key(engine.train_module, tensors)
    root = cache_root()
    directory = root / key
    try:
        compile_cache.ensure_root(root)
        entry = compile_cache.open_entry(root, key)
    except compile_cache.CacheProblem as problem:
        if not compile_cache.discard(root, key):
            raise InvalidArgumentError(str(problem)) from None
        entry = None
    if entry is not None:
        meta = entry.meta
        return PrecompileResult("refused" if "refused" in meta else "cached", str(directory), meta.get("refused", ""))
    begin = time.perf_counter()
    result: Dict = compile_build.build_entry(engine.train_module, tensors, key, root)
    return PrecompileResult(result["status"], str(directory), result.get("reason", ""), time.perf_counter() - begin)
