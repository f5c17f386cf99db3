"""Optimizer artifacts and the kernels that reproduce them (one optimizer per module).

`adamw`, `sgd`: the kernels of ORT's training-API optimizer artifacts (AdamWOptimizer,
SGDOptimizerV2), `clip_grad_norm` (InplaceClipGradNorm, before either).  `legacy_sgd`, `legacy_adam`, `lamb`: the optimizers of ORT's legacy
TrainingSession (SGDOptimizer, AdamOptimizer, LambOptimizer), as functional kernels and
torch optimizers over them.
"""

from .adamw import PreparedFusedAdamW, adamw_step
from .artifact import OptimizerSpec, parse_optimizer_model
from .clip_grad_norm import clip_grad_norm_
from .lamb import Lamb, lamb_step
from .legacy_adam import LegacyAdam, legacy_adam_step
from .legacy_sgd import LegacySGD
from .lr_schedule import linear_lr_factor
from .sgd import sgd_step

__all__ = [
    "PreparedFusedAdamW",
    "adamw_step",
    "sgd_step",
    "clip_grad_norm_",
    "linear_lr_factor",
    "OptimizerSpec",
    "parse_optimizer_model",
    "LegacySGD",
    "LegacyAdam",
    "legacy_adam_step",
    "Lamb",
    "lamb_step",
]
