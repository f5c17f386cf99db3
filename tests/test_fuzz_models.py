"""Fuzz target: loading a damaged training model (and building the engine over it).

Seeds: the training models of a few committed fixtures (an MLP, a CNN with BatchNorm, an
LSTM, a transformer).  Each example overwrites 1-3 bytes, or writes an extreme 32-bit word,
or cuts the file, and builds `Module(model_bytes, state)`.  The only allowed outcomes: an
error of the library's one family (`OrtTorchCompatError`: unreadable model, graph that
cannot be converted, mismatch with the checkpoint), or a module that trains one step.
Nothing may hang or raise anything else (a TypeError from a damaged string field, a
KeyError from a dangling name...).  Derandomized in CI; ORT_TORCH_COMPAT_FUZZ_EXAMPLES
sets the count for a long local run.
"""

from __future__ import annotations

import os
import warnings

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import ort_torch_compat.api as api
from ort_torch_compat.errors import OrtTorchCompatError
from tests.byte_mutations import mutate, mutation
from tests.conftest import FIXTURES

SEED_CONFIGS = ["mlp_ce_adamw_op17", "cnn_ce_adamw_op17", "lstm_ce_adamw_op17", "transformer_ce_adamw_op17"]
SEEDS = {name: (FIXTURES / name / "training_model.onnx").read_bytes() for name in SEED_CONFIGS}
STATES = {name: api.CheckpointState.load_checkpoint(FIXTURES / name / "checkpoint") for name in SEED_CONFIGS}
EXAMPLES = int(os.environ.get("ORT_TORCH_COMPAT_FUZZ_EXAMPLES", "120"))


def _feeds(module: api.Module) -> list:
    engine = module._engine
    return [
        np.ones(
            [d if isinstance(d, int) and d > 0 else 2 for d in (spec.shape or ())],
            dtype=np.float32 if spec.elem_type == 1 else np.int64,
        )
        for spec in engine.train_io.user_inputs
    ]


@settings(max_examples=EXAMPLES, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.sampled_from(SEED_CONFIGS), st.lists(mutation, min_size=1, max_size=3))
def test_fuzzed_training_models_load_or_fail_cleanly(seed, steps):
    data = mutate(SEEDS[seed], steps)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            module = api.Module(data, STATES[seed])
        except OrtTorchCompatError:
            return
        try:
            module(*_feeds(module))
        except OrtTorchCompatError:
            return  # a model that loads may still refuse these made-up inputs, with our error
