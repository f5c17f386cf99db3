"""The training engine: state, parameter storage, train/eval/optimizer steps, checkpoint I/O."""

from .checkpoint_io import load_state, record_from_state, save_state, state_from_record
from .optimizer_engine import OptimizerEngine
from .state import OptimizerState, ParameterSlot, TrainingState
from .training_engine import TrainingEngine

__all__ = [
    "TrainingEngine",
    "OptimizerEngine",
    "TrainingState",
    "ParameterSlot",
    "OptimizerState",
    "load_state",
    "save_state",
    "record_from_state",
    "state_from_record",
]
