"""The Flower App's components: ``server`` (ServerApp) and ``client`` (ClientApp).

The devices' data here is the synthetic non-IID split of examples/federated_flower.py
(partition ``partition-id`` of ``num-partitions``, from each SuperNode's ``--node-config``);
a real device would read its own.
"""

from __future__ import annotations

import os
import pathlib

import numpy as np

from ort_torch_compat.federated import OrtClient, client_app, server_app

os.environ.setdefault("ORT_TORCH_COMPAT_COMPILE", "eager")  # tiny model, short runs: no compile, no trace
CENTERS = np.array([[-2.0, 0.0], [2.0, 0.0], [0.0, 2.5]], dtype=np.float32)


def device_data(client: int, seed: int = 0):
    """Device `client`'s (train, eval) data: 80% of its examples from its own dominant class
    (client % 3), the rest from any class; 120 + 60 * client training examples."""
    rng = np.random.default_rng([seed, client])

    def draw(size: int):
        dominant = client % len(CENTERS)
        labels = np.where(rng.random(size) < 0.8, dominant, rng.integers(0, len(CENTERS), size))
        features = CENTERS[labels] + rng.normal(scale=0.9, size=(size, 2)).astype(np.float32)
        return [features.astype(np.float32), labels.astype(np.int64)]

    return draw(120 + 60 * client), draw(100)


def _artifacts(run_config) -> pathlib.Path:
    if not run_config.get("artifacts"):
        raise ValueError("set the run config's 'artifacts' to the ORT artifacts folder (flwr run --run-config)")
    return pathlib.Path(str(run_config["artifacts"]))


def _make_client(context) -> OrtClient:
    index = int(context.node_config["partition-id"])
    train, evaluation = device_data(index)
    out = context.run_config.get("out-dir") or None
    return OrtClient(
        _artifacts(context.run_config), train, evaluation, batch_size=32, client_id=index, checkpoint_dir=out
    )


client = client_app(_make_client)
server = server_app()  # checkpoint, out-dir, rounds, epochs, lr, min-clients: from the run config
