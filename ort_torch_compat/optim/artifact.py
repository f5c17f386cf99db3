"""Reading ORT's optimizer artifact: which optimizer, with which hyperparameters.

The artifact is a one-node graph (com.microsoft AdamWOptimizer or SGDOptimizerV2) over
fixed inputs; we validate it like ORT and keep only the node's attributes, since the
arithmetic is reproduced by our own kernels.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List

from ..errors import ModelLoadError

if TYPE_CHECKING:
    import onnx

ADAMW_INPUTS = ["learning_rate", "step", "params", "gradients", "first_order_moments", "second_order_moments"]
SGD_INPUTS = ["learning_rate", "step", "params", "gradients", "first_order_moments"]

# Kernel defaults when an attribute is absent (ORT's AdamWOptimizer schema).
ADAMW_DEFAULTS = {"alpha": 0.9, "beta": 0.999, "epsilon": 1e-8, "weight_decay": 0.0, "adam_mode": 0, "correct_bias": 1}


@dataclass
class OptimizerSpec:
    kind: str                                # "AdamW" or "SGD"
    attributes: Dict[str, float] = field(default_factory=dict)
    moment_names: List[str] = field(default_factory=list)


def parse_optimizer_model(model: "onnx.ModelProto", name: str) -> OptimizerSpec:
    import onnx  # loaded with the model already; not at package import

    ops = [node for node in model.graph.node if node.domain == "com.microsoft"
           and node.op_type in ("AdamWOptimizer", "SGDOptimizerV2")]
    if len(ops) != 1:
        found = sorted({f"{node.domain or 'ai.onnx'}::{node.op_type}" for node in model.graph.node})
        raise ModelLoadError(
            f"optimizer model {name} must contain exactly one com.microsoft AdamWOptimizer or SGDOptimizerV2 node; "
            f"found {found or 'no nodes'}"
        )
    node = ops[0]
    actual = [info.name for info in model.graph.input]
    expected = ADAMW_INPUTS if node.op_type == "AdamWOptimizer" else SGD_INPUTS
    if actual != expected:
        raise ModelLoadError(f"optimizer model {name}: Invalid graph inputs. Expected: {expected} Actual: {actual}")
    attributes = {attr.name: onnx.helper.get_attribute_value(attr) for attr in node.attribute}
    if node.op_type == "AdamWOptimizer":
        merged = {**ADAMW_DEFAULTS, **attributes}
        if merged["adam_mode"] not in (0, 1) or merged["correct_bias"] not in (0, 1):
            raise ModelLoadError(f"optimizer model {name}: adam_mode and correct_bias must be 0 or 1")
        if merged["adam_mode"] == 0 and merged["correct_bias"] != 1:
            raise ModelLoadError(f"optimizer model {name}: adam_mode 0 requires correct_bias=1")
        return OptimizerSpec("AdamW", merged, ["momentum0", "momentum1"])
    return OptimizerSpec("SGD", {}, ["momentum0"])
