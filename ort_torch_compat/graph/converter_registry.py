"""Which converter turns an ONNX node into a torch module.

Our own converters (graph/converters/) come first; onnx2torch's registry is the fallback.
Both are keyed by the schema version a converter was written for, and a node resolves to the
schema version its op has at the model's opset (ONNX's since-version list, `onnx.defs`).

Version fallback, the one rule: a converter written for schema version `a` also converts
version `b > a` exactly when every schema step between them is *type-list-only*:

- the newer schema has the same inputs and outputs (names, optionality, variadic-ness,
  descriptions), the same attributes (names, types, defaults, descriptions) and the same
  operator documentation, whitespace aside.  Then ONNX re-declared the op only to change its
  type lists (opsets 13-21 did that for most ops: float8, bfloat16, int4 ...);
- or the step is in `_EDITORIAL_STEPS`: steps whose documentation changed in wording,
  formatting or type notes only.  Each was read in the schema diff and is listed with what
  changed.

Measured on onnx 1.23's schemas up to opset 21 (301 consecutive version steps of 193 ops):
92 steps are type-list-only by the first test; 91 change only documentation or descriptions,
37 of them editorially (listed below) and the others by extending the meaning (negative axes,
broadcasting, new attribute values such as Pad's "wrap" or ScatterND's "max"); 118 change
inputs, outputs or attributes.  Every step that is not type-list-only needs a converter
registered for its version, here or in onnx2torch; otherwise the op is reported unsupported
rather than converted with an older meaning.

Ops that ONNX does not define at the model's opset but ONNX Runtime does in the ai.onnx domain
(its own LayerNormalization below opset 17, SimplifiedLayerNormalization) have one ORT schema,
version 1.  Other domains (com.microsoft, our fusion domain) have one version per op: the
converter registered for the highest version up to the domain's opset is used.
"""

from __future__ import annotations

import functools
import re
from collections import defaultdict
from typing import Callable, Dict, List, Optional, Tuple

from onnx import defs
from onnx2torch.node_converters.registry import get_converter as _onnx2torch_converter
from onnx2torch.onnx_graph import OnnxGraph
from onnx2torch.onnx_node import OnnxNode
from onnx2torch.utils.common import OperationConverterResult

Converter = Callable[[OnnxNode, OnnxGraph], OperationConverterResult]

# (domain, op_type) -> {schema version written for: converter}
_OUR_CONVERTERS: Dict[Tuple[str, str], Dict[int, Converter]] = defaultdict(dict)

# Version steps whose schema documentation changed, but only editorially (wording, formatting,
# notes about types).  (op, newer version): what changed.
_EDITORIAL_STEPS = {
    ("Abs", 13): "wording",
    ("Add", 14): "note on the added integer types",
    ("Sub", 14): "note on the added integer types",
    ("Mul", 14): "note on the added integer types",
    ("Div", 14): "note on the added integer types",
    ("ArgMax", 13): "wording",
    ("ArgMin", 13): "wording",
    ("Cast", 13): "conversion rules for the added bfloat16 type",
    ("Ceil", 13): "states that integral, +-0, NaN and infinite inputs are returned as is",
    ("Floor", 13): "states that integral, +-0, NaN and infinite inputs are returned as is",
    ("DepthToSpace", 13): "formatting",
    ("Dropout", 10): "wording",
    ("Gather", 13): "examples and formatting",
    ("GatherElements", 13): "formatting",
    ("GatherND", 13): "formatting",
    ("Gemm", 13): "formatting",
    ("LRN", 13): "formatting",
    ("MaxPool", 11): "states the stride and dilation defaults",
    ("MeanVarianceNormalization", 13): "formatting",
    ("Mod", 13): "states the NaN/infinity results of C fmod",
    ("NegativeLogLikelihoodLoss", 13): "formatting",
    ("SoftmaxCrossEntropyLoss", 13): "formatting",
    ("Pad", 13): "constant_value note for the added string and bool types",
    ("ReduceMax", 12): "documentation reorganised for the added int8/uint8 types",
    ("ReduceMin", 12): "documentation reorganised for the added int8/uint8 types",
    ("ReduceMax", 20): "comparison order of the added bool type",
    ("ReduceMin", 20): "comparison order of the added bool type",
    ("ReduceMax", 13): "wording",
    ("ReduceMin", 13): "wording",
    ("ReduceMean", 13): "wording",
    ("ReduceL1", 13): "wording",
    ("ReduceL2", 13): "wording",
    ("ReduceLogSum", 13): "wording",
    ("ReduceLogSumExp", 13): "wording",
    ("ReduceProd", 13): "wording",
    ("ReduceSumSquare", 13): "wording",
    ("Transpose", 21): "states that perm has the input's rank",
}


class DuplicateConverterError(ValueError):
    """A converter is already registered for this (domain, op, version)."""


def register(op_type: str, *since_versions: int, domain: str = "") -> Callable[[Converter], Converter]:
    """Register one of our converters for the given schema versions (each the version it was
    written for; newer type-list-only versions follow by the module's rule).  A second converter
    for the same (domain, op, version) is refused, as onnx2torch refuses one."""

    def decorate(converter: Converter) -> Converter:
        entries = _OUR_CONVERTERS[(domain, op_type)]
        for version in since_versions:
            if version in entries:
                raise DuplicateConverterError(
                    f"a converter for ({domain or 'ai.onnx'}, {op_type}, version {version}) is already registered: "
                    f"{entries[version].__module__}.{entries[version].__name__}"
                )
            entries[version] = converter
        return converter

    return decorate


# ---- the ONNX schema's since-version list ----------------------------------------------------


@functools.lru_cache(maxsize=None)
def _schemas() -> Dict[str, Dict[int, "defs.OpSchema"]]:
    table: Dict[str, Dict[int, defs.OpSchema]] = defaultdict(dict)
    for schema in defs.get_all_schemas_with_history():
        if schema.domain == "":
            table[schema.name][schema.since_version] = schema
    return dict(table)


def _text(value: str) -> str:
    return re.sub(r"\s+", " ", value or "").strip()


def _signature(schema: "defs.OpSchema") -> tuple:
    """Everything of a schema except its type constraints."""

    def formal(parameter):
        return parameter.name, int(parameter.option.value), parameter.is_homogeneous, _text(parameter.description)

    attributes = sorted(
        (a.name, int(a.type.value), a.required, a.default_value.SerializeToString(), _text(a.description))
        for a in schema.attributes.values()
    )
    return (tuple(map(formal, schema.inputs)), tuple(map(formal, schema.outputs)), tuple(attributes), _text(schema.doc))


@functools.lru_cache(maxsize=None)
def type_list_only(op_type: str, version: int) -> bool:
    """Whether schema `version` of an ai.onnx op differs from the previous one only in types."""
    versions = sorted(_schemas().get(op_type, {}))
    if version not in versions or versions.index(version) == 0:
        return False
    if (op_type, version) in _EDITORIAL_STEPS:
        return True
    previous = versions[versions.index(version) - 1]
    table = _schemas()[op_type]
    return _signature(table[previous]) == _signature(table[version])


def schema_version(domain: str, op_type: str, opset: int) -> int:
    """The since_version of the op's schema at `opset` (1 for ORT's own ai.onnx schemas);
    other domains use the domain's opset."""
    if domain not in ("", "ai.onnx"):
        return opset
    versions = [v for v in _schemas().get(op_type, {}) if v <= opset]
    return max(versions) if versions else 1


def _served_versions(op_type: str, version: int) -> List[int]:
    """`version` and the older versions whose converters also serve it, newest first."""
    versions = sorted((v for v in _schemas().get(op_type, {}) if v <= version), reverse=True)
    if not versions:
        return [version]
    served = [versions[0]]
    for newer, older in zip(versions, versions[1:]):
        if not type_list_only(op_type, newer):
            break
        served.append(older)
    return served


def is_ours(domain: str, op_type: str, opset: int) -> bool:
    """Whether one of our converters (not onnx2torch's) handles this op at this opset."""
    return _our_converter(domain, op_type, opset) is not None


def _our_converter(domain: str, op_type: str, opset: int) -> Optional[Converter]:
    entries = _OUR_CONVERTERS.get((domain, op_type))
    if not entries:
        return None
    version = schema_version(domain, op_type, opset)
    if domain not in ("", "ai.onnx") or op_type not in _schemas():
        usable = [v for v in entries if v <= version]
        return entries[max(usable)] if usable else None
    for candidate in _served_versions(op_type, version):
        if candidate in entries:
            return entries[candidate]
    return None


def find_converter(domain: str, op_type: str, opset: int) -> Optional[Converter]:
    """The converter for this op at this opset, or None when nothing handles it."""
    ours = _our_converter(domain, op_type, opset)
    if ours is not None or domain not in ("", "ai.onnx"):
        return ours
    for version in _served_versions(op_type, schema_version(domain, op_type, opset)):
        try:
            return _onnx2torch_converter(operation_type=op_type, version=version, domain="")
        except NotImplementedError:
            continue
    return None
