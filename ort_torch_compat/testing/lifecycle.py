"""Partial runs of the standard scenario, for save/stop/resume tests in either library.

`train_steps(api, state, module, optimizer, spec, first, last)` performs scenario steps
first..last exactly as ort_torch_compat/testing/scenario.py does (same inputs, the same accumulation step),
so a run split by a checkpoint can be compared with ORT's uninterrupted fixture.
"""

from __future__ import annotations

from typing import Any, Dict

import numpy as np

from .scenario import make_batch


def train_steps(state: Any, module: Any, optimizer: Any, spec: dict, first: int, last: int) -> Dict[str, np.ndarray]:
    names = [i["name"] for i in spec["inputs"]]
    params = list(spec["trainable_params"]) + list(spec.get("frozen_params", []))
    accumulate_step = int(spec.get("accumulate_step", 2))
    record: Dict[str, np.ndarray] = {}
    module.train()
    for k in range(first, last + 1):
        for j in range(1, (2 if k == accumulate_step else 1) + 1):
            batch = make_batch(spec, k, j)
            loss = module(*[batch[n] for n in names])
            record[f"step{k}/call{j}/loss"] = np.array(loss[0] if isinstance(loss, tuple) else loss)
        optimizer.step()
        for name in params:
            record[f"step{k}/param/{name}"] = np.array(state.parameters[name].data)
        module.lazy_reset_grad()
    return record
