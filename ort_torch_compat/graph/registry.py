"""Which converter turns an ONNX node into a torch module.

Our own converters come first; onnx2torch's registry is the fallback.  onnx2torch keys its
converters by the exact schema version an op has at the model's opset, so every schema
bump (opset 18-21 re-declared many ops only to widen their type lists) makes an op
"unsupported" although the old converter is still right.  We therefore walk down to the
newest older schema version onnx2torch knows, except for ops whose *semantics* changed in
a newer version: those must be converted by a converter of ours or fail loudly.
"""
from __future__ import annotations

from typing import Callable, Dict, List, Optional, Tuple

from onnx import defs
from onnx2torch.node_converters.registry import get_converter as _onnx2torch_converter
from onnx2torch.onnx_graph import OnnxGraph
from onnx2torch.onnx_node import OnnxNode
from onnx2torch.utils.common import OperationConverterResult

Converter = Callable[[OnnxNode, OnnxGraph], OperationConverterResult]

# (domain, op_type) -> [(first schema version handled, converter)], newest last.
_OUR_CONVERTERS: Dict[Tuple[str, str], List[Tuple[int, Converter]]] = {}

# Ops whose inputs/attributes changed meaning in a newer schema: an older onnx2torch
# converter would silently compute something else, so no version fallback for them.
_NO_FALLBACK = {
    "ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
    "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare", "Split", "Pad", "Resize",
    "AveragePool", "MaxPool", "GroupNormalization", "Col2Im", "DFT",
}


def register(op_type: str, *since_versions: int, domain: str = "") -> Callable[[Converter], Converter]:
    """Register one of our converters for the given schema versions (first version each)."""

    def decorate(converter: Converter) -> Converter:
        entries = _OUR_CONVERTERS.setdefault((domain, op_type), [])
        entries.extend((version, converter) for version in since_versions)
        entries.sort(key=lambda entry: entry[0])
        return converter

    return decorate


def schema_version(domain: str, op_type: str, opset: int) -> int:
    """The since_version of the op's schema at `opset`; custom domains use the opset as is."""
    if domain not in ("", "ai.onnx"):
        return opset
    try:
        return defs.get_schema(op_type, max_inclusive_version=opset, domain="").since_version
    except (RuntimeError, defs.SchemaError):
        return opset


def is_ours(domain: str, op_type: str, opset: int) -> bool:
    """Whether one of our converters (not onnx2torch's) handles this op at this opset."""
    version = schema_version(domain, op_type, opset)
    return any(first <= version for first, _ in _OUR_CONVERTERS.get((domain, op_type), []))


def find_converter(domain: str, op_type: str, opset: int) -> Optional[Converter]:
    """The converter for this op at this opset, or None when nothing handles it."""
    version = schema_version(domain, op_type, opset)
    ours = [conv for first, conv in _OUR_CONVERTERS.get((domain, op_type), []) if first <= version]
    if ours:
        return ours[-1]
    if domain not in ("", "ai.onnx"):
        return None
    while version > 0:
        try:
            return _onnx2torch_converter(operation_type=op_type, version=version, domain="")
        except NotImplementedError:
            if op_type in _NO_FALLBACK:
                return None
        older = schema_version(domain, op_type, version - 1)
        if older >= version:
            return None
        version = older
    return None
