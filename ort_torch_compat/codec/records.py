"""Plain in-memory records mirroring the tables of ORT's `ODTC` checkpoint file.

The codec speaks only in these records, so the engine never touches flatbuffers and the
codec never touches torch: each side can change without the other.  Tensor payloads stay
as little-endian C-order bytes because that is what the file holds and because it keeps
dtypes numpy cannot represent (bfloat16, float8) lossless.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple, Union

PropertyValue = Union[int, float, str]


@dataclass
class TensorRecord:
    """One `onnxruntime.fbs.Tensor`: a parameter or an optimizer moment."""

    name: str
    data_type: int
    dims: Tuple[int, ...]
    raw_data: bytes = b""
    doc_string: str = ""
    string_data: Optional[List[str]] = None


@dataclass
class ModuleStateRecord:
    """Trainable and frozen parameters, in the order the file stores them."""

    trainable: List[TensorRecord] = field(default_factory=list)
    frozen: List[TensorRecord] = field(default_factory=list)
    is_nominal: bool = False
    has_external_data: bool = False


@dataclass
class ParameterOptimizerStateRecord:
    """The moments of one parameter (`momentum0`, `momentum1`, ...)."""

    param_name: str
    momentums: List[TensorRecord] = field(default_factory=list)


@dataclass
class OptimizerGroupRecord:
    group_name: str
    step: int = 0
    initial_learning_rate: float = 0.0
    states: List[ParameterOptimizerStateRecord] = field(default_factory=list)


@dataclass
class CheckpointRecord:
    """A whole checkpoint.

    `None` means the field is absent from the file, which is different from an empty
    vector: ORT's artifact writer omits optimizer groups, its state writer always writes
    them.  Keeping the difference is what makes byte-exact re-encoding possible.
    """

    version: int = 2
    module_state: Optional[ModuleStateRecord] = None
    optimizer_groups: Optional[List[OptimizerGroupRecord]] = None
    properties: Optional[Dict[str, PropertyValue]] = None
