"""Federated training of ORT artifacts on Flower: 3 devices, FedAvg, ORT checkpoints per round.

    pip install "ort_torch_compat[federated]"
    python examples/federated_flower.py --clients 3 --rounds 3 --out /tmp/fl

Each simulated device holds a non-IID share of a synthetic 3-class problem (mostly one class,
and a different number of examples per device), trains the committed MLP artifacts
(examples/artifacts/mlp_classifier) with ort_torch_compat's CheckpointState/Module/Optimizer
and sends its trainable parameters back; Flower's FedAvg averages them.  Written under --out:

    round_<r>/global/checkpoint          the global model after round r (ORT checkpoint format)
    round_<r>/client_<i>/checkpoint      device i's trained state of round r, before aggregation
    round_<r>/num_examples.json          the example counts FedAvg weighted the devices by
    eval_loss.json                       Flower's aggregated (federated) eval loss per round

It runs Flower's Simulation Runtime in this process (ort_torch_compat.federated.run_simulation,
no Ray needed).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import pathlib
import sys
import tempfile
import time

os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")  # Flower's usage telemetry: off
os.environ.setdefault("ORT_TORCH_COMPAT_COMPILE", "eager")  # tiny model, short run: no compile, no trace

ARTIFACTS = pathlib.Path(__file__).resolve().parent / "artifacts" / "mlp_classifier"
APP_DIR = pathlib.Path(__file__).resolve().parent / "federated_flower_app"  # the same federation as a Flower App
sys.path.insert(0, str(APP_DIR))
from ort_fl_app import device_data  # noqa: E402  (the devices' non-IID synthetic data)


def run(
    clients: int,
    rounds: int,
    out: pathlib.Path,
    *,
    local_epochs: int = 2,
    learning_rate: float = 0.01,
    client_fn=None,
    quiet: bool = False,
):
    """Run the federation; returns the server's `CheckpointStrategy` (eval losses, rejections).

    `client_fn(context, default)` may replace a device's client (tests plug in faulty ones)."""
    from ort_torch_compat.federated import OrtClient, client_app, run_simulation, server_app

    strategies = []

    def make_client(context):
        index = int(context.node_config["partition-id"])
        train, evaluation = device_data(index)
        client = OrtClient(ARTIFACTS, train, evaluation, batch_size=32, client_id=index, checkpoint_dir=out)
        return client if client_fn is None else client_fn(context, client)

    def fedavg():
        from flwr.server.strategy import FedAvg

        # every device every round; a round goes on with at least one good update
        return FedAvg(
            fraction_fit=1.0,
            fraction_evaluate=1.0,
            min_fit_clients=clients,
            min_evaluate_clients=clients,
            min_available_clients=clients,
        )

    app = server_app(
        ARTIFACTS / "checkpoint",
        out,
        num_rounds=rounds,
        strategy_fn=fedavg,
        local_epochs=local_epochs,
        learning_rate=learning_rate,
        on_strategy=strategies.append,
    )
    if quiet:  # Flower's INFO lines and its run_simulation deprecation notice; our logger stays
        logging.getLogger("flwr").setLevel(logging.ERROR)
    run_simulation(app, client_app(make_client), num_supernodes=clients)
    return strategies[-1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--clients", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--local-epochs", type=int, default=2)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--out", type=pathlib.Path, default=pathlib.Path(tempfile.gettempdir()) / "ort_fl_example")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    logging.getLogger("ort_torch_compat.federated").setLevel(logging.INFO)
    started = time.perf_counter()
    strategy = run(
        args.clients, args.rounds, args.out, local_epochs=args.local_epochs, learning_rate=args.lr, quiet=True
    )
    for server_round, loss in sorted(strategy.eval_losses.items()):
        counts = json.loads((args.out / f"round_{server_round}" / "num_examples.json").read_text())
        print(f"round {server_round}: global eval loss {loss:.4f}  (clients {counts})")
    print(
        f"wrote {args.out}/round_<r>/global/checkpoint for rounds 1..{args.rounds} "
        f"in {time.perf_counter() - started:.1f} s"
    )
    losses = [strategy.eval_losses[r] for r in sorted(strategy.eval_losses)]
    return 0 if len(losses) == args.rounds and losses[-1] < losses[0] else 1


if __name__ == "__main__":
    sys.exit(main())
