"""Optimizer artifacts and the kernels that reproduce them (one optimizer per module)."""
from .adamw import adamw_step
from .artifact import OptimizerSpec, parse_optimizer_model
from .lr_schedule import linear_lr_factor
from .sgd import sgd_step

__all__ = ["adamw_step", "sgd_step", "linear_lr_factor", "OptimizerSpec", "parse_optimizer_model"]
