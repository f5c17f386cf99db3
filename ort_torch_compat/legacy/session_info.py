"""Small look-alikes of onnxruntime's session metadata objects, and provider selection.

`NodeArg`, `ModelMetadata` and `SessionOptions` carry the attributes code reads from
onnxruntime's objects of the same names.  Providers map to a torch device: the first
usable entry wins, and `CPUExecutionProvider` is always last, as in onnxruntime.
"""

from __future__ import annotations

import warnings
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

import onnx
import torch

from ..engine.io_spec import onnx_type_name

CPU = "CPUExecutionProvider"
GPU_PROVIDERS = ("CUDAExecutionProvider", "ROCMExecutionProvider")


class NodeArg:
    """Name, type string ("tensor(float)") and shape (ints, symbolic names or None) of a value."""

    __slots__ = ("name", "type", "shape")

    def __init__(self, name: str, type: str, shape: Optional[List[Union[int, str, None]]]):
        self.name = name
        self.type = type
        self.shape = shape

    @classmethod
    def from_value_info(cls, info: onnx.ValueInfoProto) -> "NodeArg":
        tensor_type = info.type.tensor_type
        shape: Optional[list] = None
        if tensor_type.HasField("shape"):
            shape = []
            for dim in tensor_type.shape.dim:
                if dim.HasField("dim_value"):
                    shape.append(dim.dim_value)
                elif dim.HasField("dim_param"):
                    shape.append(dim.dim_param)
                else:
                    shape.append(None)
        return cls(info.name, onnx_type_name(tensor_type.elem_type), shape)

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, NodeArg):
            return NotImplemented
        return (self.name, self.type, self.shape) == (other.name, other.type, other.shape)

    def __hash__(self) -> int:
        return hash((self.name, self.type))

    def __repr__(self) -> str:
        return f"NodeArg(name='{self.name}', type='{self.type}', shape={self.shape})"


class ModelMetadata:
    """The model's producer, graph name, domain, doc string, version and metadata_props."""

    __slots__ = (
        "producer_name",
        "graph_name",
        "domain",
        "description",
        "graph_description",
        "version",
        "custom_metadata_map",
    )

    def __init__(self, model: onnx.ModelProto):
        self.producer_name = model.producer_name
        self.graph_name = model.graph.name
        self.domain = model.domain
        self.description = model.doc_string
        self.graph_description = model.graph.doc_string
        self.version = model.model_version
        self.custom_metadata_map = {prop.key: prop.value for prop in model.metadata_props}

    def __repr__(self) -> str:
        return (
            f"ModelMetadata(producer_name={self.producer_name!r}, graph_name={self.graph_name!r}, "
            f"domain={self.domain!r}, version={self.version})"
        )


class SessionOptions:
    """The attributes of onnxruntime.SessionOptions that scripts commonly set.

    They are stored and returned by `get_session_options()`; none changes how torch runs
    the model.  An onnxruntime.SessionOptions passed to the session is kept as is.
    """

    def __init__(self) -> None:
        self.graph_optimization_level = 99
        self.intra_op_num_threads = 0
        self.inter_op_num_threads = 0
        self.execution_mode = 0
        self.log_severity_level = 2
        self.log_verbosity_level = 0
        self.logid = ""
        self.enable_profiling = False
        self.profile_file_prefix = "onnxruntime_profile_"
        self.optimized_model_filepath = ""
        self.enable_cpu_mem_arena = True
        self.enable_mem_pattern = True
        self.use_deterministic_compute = False
        self._config: Dict[str, str] = {}

    def add_session_config_entry(self, key: str, value: str) -> None:
        self._config[str(key)] = str(value)

    def get_session_config_entry(self, key: str) -> str:
        if key not in self._config:
            raise RuntimeError(f"SessionOptions does not have configuration with key: {key}")
        return self._config[key]


def session_config_entry(options: Any, key: str) -> Optional[str]:
    """A config entry of ours or onnxruntime's SessionOptions, or None."""
    getter = getattr(options, "get_session_config_entry", None)
    if getter is None:
        return None
    try:
        return getter(key)
    except Exception:  # onnxruntime raises when the key is absent
        return None


def resolve_providers(
    providers: Optional[Sequence[Union[str, Tuple[str, Dict[str, Any]]]]],
    provider_options: Optional[Sequence[Dict[str, Any]]],
) -> Tuple[List[str], List[Dict[str, str]], torch.device]:
    """(provider names in use, their options, torch device) for onnxruntime-style arguments.

    No providers means CPU.  CUDA/ROCm need torch to see a GPU; otherwise a warning is
    issued and the next provider is tried.  Other onnxruntime providers are not available.
    """
    if providers is None:
        providers = [CPU]
    names: List[str] = []
    options: List[Dict[str, Any]] = []
    any_tuple = False
    for entry in providers:
        if isinstance(entry, (tuple, list)):
            if len(entry) != 2 or not isinstance(entry[1], dict):
                raise ValueError(f"providers entries are names or (name, options dict) tuples, got {entry!r}")
            any_tuple = True
            names.append(str(entry[0]))
            options.append(dict(entry[1]))
        else:
            names.append(str(entry))
            options.append({})
    if provider_options is not None:
        if any_tuple:
            raise ValueError("When any options are given in 'providers', 'provider_options' should not be used.")
        if len(provider_options) != len(names):
            raise ValueError("'providers' and 'provider_options' should be the same length if both are given.")
        options = [dict(o) for o in provider_options]

    for name, opts in zip(names, options):
        if name in GPU_PROVIDERS:
            if torch.cuda.is_available():
                device = torch.device("cuda", int(opts.get("device_id", 0)))
                return [name, CPU], [_stringify(opts), {}], device
            warnings.warn(
                f"{name} was requested but torch sees no GPU; falling back to the next provider.",
                RuntimeWarning,
                stacklevel=3,
            )
        elif name == CPU:
            return [CPU], [_stringify(opts)], torch.device("cpu")
        else:
            warnings.warn(
                f"{name} is not available in ort_torch_compat (torch runs on CPU or CUDA); ignoring it.",
                RuntimeWarning,
                stacklevel=3,
            )
    return [CPU], [{}], torch.device("cpu")


def _stringify(options: Dict[str, Any]) -> Dict[str, str]:
    return {str(k): str(v) for k, v in options.items()}
