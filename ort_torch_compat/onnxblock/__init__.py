"""onnxruntime-training 1.19.2's ``onnxblock`` API, without onnxruntime-training and without torch.

Build custom losses and optimizers for training artifacts::

    from ort_torch_compat import onnxblock

    class WeightedL1(onnxblock.Block):             # a custom loss is a Block
        def __init__(self):
            super().__init__()
            self.l1 = onnxblock.loss.L1Loss()
            self.mse = onnxblock.loss.MSELoss()
            self.add = onnxblock.blocks.Add()

        def build(self, output_name):               # composition: blocks call blocks
            return self.add(self.l1(output_name, "target"), self.mse(output_name, "target"))

    generate_artifacts(model, requires_grad=[...], loss=WeightedL1(), ...)

With ``ort_torch_compat.install()`` and no onnxruntime-training, ``onnxruntime.training.onnxblock``
is this package.
"""

from . import blocks, loss, optim
from ._graph_utils import reset_name_counter
from .blocks import Block
from .checkpoint_utils import load_checkpoint_to_model, save_checkpoint
from .model_accessor import base, custom_op_library, empty_base
from .onnxblock import ForwardBlock, TrainingBlock

__all__ = [
    "blocks",
    "loss",
    "optim",
    "Block",
    "ForwardBlock",
    "TrainingBlock",
    "load_checkpoint_to_model",
    "save_checkpoint",
    "base",
    "custom_op_library",
    "empty_base",
    "reset_name_counter",
]
