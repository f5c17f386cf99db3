"""Reading ORT's optimizer artifact: which optimizer, with which hyperparameters.

The artifact is a one-node graph (com.microsoft AdamWOptimizer or SGDOptimizerV2) over
fixed inputs, optionally preceded by a com.microsoft InplaceClipGradNorm on the gradients
(onnxblock's ``optim.AdamW(clip_grad=optim.ClipGradNorm(max_norm))``, which
``generate_artifacts`` accepts as its ``optimizer``); we validate it like ORT and keep only
the nodes' attributes, since the arithmetic is reproduced by our own kernels.  Any other node
is refused: ORT would run it, we would not.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Dict, List, Optional

from ..errors import ModelLoadError

if TYPE_CHECKING:
    import onnx

ADAMW_INPUTS = ["learning_rate", "step", "params", "gradients", "first_order_moments", "second_order_moments"]
SGD_INPUTS = ["learning_rate", "step", "params", "gradients", "first_order_moments"]

# Kernel defaults when an attribute is absent (ORT's AdamWOptimizer schema).
ADAMW_DEFAULTS = {"alpha": 0.9, "beta": 0.999, "epsilon": 1e-8, "weight_decay": 0.0, "adam_mode": 0, "correct_bias": 1}


@dataclass
class OptimizerSpec:
    kind: str  # "AdamW" or "SGD"
    attributes: Dict[str, float] = field(default_factory=dict)
    moment_names: List[str] = field(default_factory=list)
    clip_max_norm: Optional[float] = None  # InplaceClipGradNorm's max_norm, when the model clips


def parse_optimizer_model(model: "onnx.ModelProto", name: str) -> OptimizerSpec:
    import onnx  # loaded with the model already; not at package import

    ops = [
        node
        for node in model.graph.node
        if node.domain == "com.microsoft" and node.op_type in ("AdamWOptimizer", "SGDOptimizerV2")
    ]
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
    clip_max_norm = _clip_max_norm(model, node, name)
    attributes = {attr.name: onnx.helper.get_attribute_value(attr) for attr in node.attribute}
    if node.op_type == "AdamWOptimizer":
        merged = {**ADAMW_DEFAULTS, **attributes}
        if merged["adam_mode"] not in (0, 1) or merged["correct_bias"] not in (0, 1):
            raise ModelLoadError(f"optimizer model {name}: adam_mode and correct_bias must be 0 or 1")
        if merged["adam_mode"] == 0 and merged["correct_bias"] != 1:
            raise ModelLoadError(f"optimizer model {name}: adam_mode 0 requires correct_bias=1")
        return OptimizerSpec("AdamW", merged, ["momentum0", "momentum1"], clip_max_norm)
    return OptimizerSpec("SGD", {}, ["momentum0"], clip_max_norm)


def _clip_max_norm(model: "onnx.ModelProto", optimizer: "onnx.NodeProto", name: str) -> Optional[float]:
    """max_norm of the InplaceClipGradNorm between the `gradients` input and the optimizer node,
    None without one; ModelLoadError for any other node or wiring."""
    import onnx

    others = [node for node in model.graph.node if node is not optimizer]
    clips = [node for node in others if node.domain == "com.microsoft" and node.op_type == "InplaceClipGradNorm"]
    unknown = sorted({f"{node.domain or 'ai.onnx'}::{node.op_type}" for node in others if node not in clips})
    if unknown or len(clips) > 1:
        raise ModelLoadError(
            f"optimizer model {name}: nodes {unknown or ['InplaceClipGradNorm'] * len(clips)} besides "
            f"{optimizer.op_type} are not supported (only one com.microsoft InplaceClipGradNorm on the gradients)"
        )
    position = (
        3 if optimizer.op_type == "AdamWOptimizer" else 2
    )  # (lr, step, params, gradients, ...) / (lr, params, gradients)
    gradients = optimizer.input[position] if len(optimizer.input) > position else ""
    if not clips:
        if gradients != "gradients":
            raise ModelLoadError(f"optimizer model {name}: {optimizer.op_type} reads gradients from '{gradients}'")
        return None
    clip = clips[0]
    if list(clip.input) != ["gradients"] or len(clip.output) != 1 or clip.output[0] != gradients:
        raise ModelLoadError(
            f"optimizer model {name}: InplaceClipGradNorm must clip the 'gradients' input that "
            f"{optimizer.op_type} reads (it reads {list(clip.input)}, writes {list(clip.output)})"
        )
    attributes = {attr.name: onnx.helper.get_attribute_value(attr) for attr in clip.attribute}
    norm_type = attributes.get("norm_type", b"fro")
    norm_type = norm_type.decode() if isinstance(norm_type, bytes) else norm_type
    if norm_type != "fro":
        raise ModelLoadError(
            f"optimizer model {name}: InplaceClipGradNorm norm_type '{norm_type}' is not supported "
            "(ORT supports 'fro' only)"
        )
    return float(attributes.get("max_norm", 1.0))
