"""The configs of the artifact-generation fixtures and the steps that record them with ORT.

``CONFIGS`` lists the fixtures (``tests/fixtures/artifacts/<name>/``); for each, ``build_model``
builds the torch model, ``export_model`` exports it, ``ort_generate`` makes onnxruntime-training's
artifacts from it, ``scenario_spec`` describes the training scenario and ``run_ort_scenario``
runs it on ``onnxruntime.training.api``.  ``scripts/make_artifact_fixtures.py`` records the
fixtures with these and ``tests/test_artifacts_parity.py`` re-exports a fixture model with them.
torch, onnx and onnxruntime-training are imported by the functions that need them.
"""

from __future__ import annotations

import dataclasses
import io
import math
import pathlib
import warnings
from typing import Any, Callable, Dict, List, Optional

from . import prepare_for_artifacts as prep
from . import reference_models as reference
from . import scenario

LOSS_TYPES = {"mse": "MSELoss", "ce": "CrossEntropyLoss", "bce": "BCEWithLogitsLoss", "l1": "L1Loss"}
DROPOUT_SEED = 1234


@dataclasses.dataclass
class Config:
    """One fixture.  ``build`` (optional) makes the model instead of ``build_model(family, loss)``:
    a function of the loss name returning build_model's tuple, e.g. for a model-zoo entry."""

    family: str
    loss: str
    optim: str
    opset: int
    extra: Dict[str, Any] = dataclasses.field(default_factory=dict)
    suffix: str = ""
    build: Optional[Callable[[str], tuple]] = None

    @property
    def name(self) -> str:
        return f"{self.family}_{self.loss}_{self.optim}{self.suffix}_op{self.opset}"


CONFIGS: List[Config] = [
    Config("mlp", "ce", "adamw", 17),
    Config("mlp", "mse", "sgd", 14),
    Config("mlp", "bce", "adamw", 17),
    Config("mlp", "l1", "sgd", 17),
    Config("mlp", "mse", "adamw", 17, {"optimizer": {"AdamW": {"weight_decay": 0.01}}}, "_wd"),
    Config("mlp", "mse", "adamw", 17, {"kwargs": {"nominal_checkpoint": True}}, "_nominal"),
    Config("mlp3d", "mse", "adamw", 17),
    Config("mlp3d", "l1", "adamw", 14),
    Config("cnn", "mse", "adamw", 17),
    Config("cnn", "ce", "sgd", 14),
    Config("cnngap", "bce", "adamw", 17),
    Config("transformer", "ce", "adamw", 17),
    Config("transformer", "mse", "adamw", 14),
    Config("decoder", "ce", "adamw", 17),
    Config("decoder", "mse", "sgd", 14),
    Config("decoder", "ce", "adamw", 18),
    Config("gru", "ce", "adamw", 17),
    Config("gru", "mse", "sgd", 14),
    Config("lstm", "bce", "adamw", 17),
    Config("lstm", "l1", "sgd", 14),
    Config("tensorops", "mse", "adamw", 17),
    Config("frozen", "ce", "adamw", 17),
    Config(
        "twoout",
        "mse",
        "adamw",
        17,
        {"kwargs": {"loss_input_names": ["y"], "additional_output_names": ["aux"]}},
        "_lossinput_addout",
    ),
    Config("dropout", "mse", "adamw", 17, {"seed": DROPOUT_SEED}),
    # Symbolic batch (and sequence) dims: shape-dependent gradients are computed at run time.
    Config("mlp", "ce", "adamw", 17, {"dynamic_axes": True}, "_dyn"),
    # ORT's own artifacts for the dynamic CNN crash ORT (AveragePoolGrad with a symbolic batch):
    # its reference comes from ORT's artifacts of the static export of the same model.
    Config("cnn", "mse", "sgd", 17, {"dynamic_axes": True, "ort_static_twin": True}, "_dyn"),
    Config("transformer", "ce", "adamw", 17, {"dynamic_axes": True}, "_dyn"),
    Config("lstm", "mse", "adamw", 17, {"dynamic_axes": True}, "_dyn"),
]

SEQUENCE_FAMILIES = ("transformer", "decoder")


# --------------------------------------------------------------------------- models
def build_model(family: str, loss: str):
    """``(module, args, input_names, output_names, input_kinds, training_mode, frozen)`` as in make_reference."""
    if family not in ("mlp3d", "cnngap", "decoder", "dropout"):
        return reference.build_model(family, loss)
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    dout = 3
    training = torch.onnx.TrainingMode.EVAL
    kinds = {"x": ("normal", 0)}

    class MLP3D(nn.Module):
        """MatMul+Add layers on a 3-D input, ReLU, Sigmoid, arithmetic, a mean over one axis."""

        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(6, 12)
            self.fc2 = nn.Linear(12, 8)
            self.head = nn.Linear(8, dout)

        def forward(self, x):
            h = torch.relu(self.fc1(x))
            h = torch.sigmoid(self.fc2(h)) * 2.0 - 1.0
            return self.head(h.mean(dim=1) / 1.5)

    class CNNGAP(nn.Module):
        """Conv (strided, grouped) and BatchNorm exported in inference mode, GlobalAveragePool."""

        def __init__(self):
            super().__init__()
            self.conv1 = nn.Conv2d(2, 4, 3, stride=2, padding=1)
            self.bn1 = nn.BatchNorm2d(4)
            self.conv2 = nn.Conv2d(4, 4, 3, padding=1, groups=2, bias=False)
            self.bn2 = nn.BatchNorm2d(4)
            self.fc = nn.Linear(4, dout)

        def forward(self, x):
            h = torch.relu(self.bn1(self.conv1(x)))
            h = torch.sigmoid(self.bn2(self.conv2(h)))
            return self.fc(torch.flatten(F.adaptive_avg_pool2d(h, 1), 1))

    class Decoder(nn.Module):
        """A causal decoder block: embedding, RMSNorm (Pow/ReduceMean/Sqrt/Div), split QKV,
        masked (Where) softmax attention, Dropout (ratio 0), LayerNorm, tanh-GELU MLP, a
        pooled summary token (Squeeze/Unsqueeze/Slice/Concat) and a padding mask (Cast)."""

        def __init__(self, vocab=11, max_len=8, d=8, heads=2, ncls=5):
            super().__init__()
            self.d, self.heads, self.ncls = d, heads, ncls
            self.tok = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(torch.randn(1, max_len, d) * 0.1)
            self.norm_w = nn.Parameter(torch.ones(d))
            self.qkv = nn.Linear(d, 3 * d)
            self.proj = nn.Linear(d, d)
            self.ln = nn.LayerNorm(d)
            self.fc1 = nn.Linear(d, 2 * d)
            self.fc2 = nn.Linear(2 * d, d)
            self.head = nn.Linear(d, ncls if loss == "ce" else dout)
            self.register_buffer("causal", torch.tril(torch.ones(max_len, max_len, dtype=torch.bool)), persistent=False)

        def forward(self, ids):
            batch, seq = ids.shape
            x = self.tok(ids) + self.pos[:, :seq]
            h = x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + 1e-5) * self.norm_w
            q, k, v = self.qkv(h).split(self.d, dim=-1)
            head_dim = self.d // self.heads
            q, k, v = (t.reshape(batch, seq, self.heads, head_dim).transpose(1, 2) for t in (q, k, v))
            scores = (q @ k.transpose(-2, -1)) / math.sqrt(head_dim)
            scores = scores.masked_fill(~self.causal[:seq, :seq], -1e4)
            weights = F.dropout(scores.softmax(-1), p=0.0, training=self.training)
            attended = (weights @ v).transpose(1, 2).reshape(batch, seq, self.d)
            x = x + self.proj(attended)
            x = x + self.fc2(F.gelu(self.fc1(self.ln(x)), approximate="tanh"))
            summary = x.mean(dim=1, keepdim=True).squeeze(1)
            x = torch.cat([summary.unsqueeze(1), x[:, 1:]], dim=1)
            x = x * (ids > 0).unsqueeze(-1).to(x.dtype)
            y = self.head(x)
            return y.reshape(-1, self.ncls) if loss == "ce" else y.reshape(batch * seq, -1)[:, :dout]

    class DropoutMLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(6, 16)
            self.drop = nn.Dropout(0.3)
            self.fc2 = nn.Linear(16, dout)

        def forward(self, x):
            return self.fc2(self.drop(torch.relu(self.fc1(x))))

    if family == "mlp3d":
        model, args = MLP3D(), (torch.randn(2, 5, 6),)
    elif family == "cnngap":
        model, args = CNNGAP(), (torch.randn(4, 2, 6, 6),)
    elif family == "decoder":
        model, args = Decoder(), (torch.randint(1, 11, (2, 6)),)
        kinds = {"x": ("int", 11)}
        training = torch.onnx.TrainingMode.TRAINING  # keeps the (ratio 0) Dropout node
    else:
        model, args = DropoutMLP(), (torch.randn(4, 6),)
        training = torch.onnx.TrainingMode.TRAINING
    with torch.no_grad():  # distinct initializers (the exporter de-duplicates equal ones), non-trivial BN stats
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        for name, b in model.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(torch.randn_like(b) * 0.1)
            elif name.endswith("running_var"):
                b.copy_(1.0 + torch.rand_like(b) * 0.5)
    return model, args, ["x"], ["y"], kinds, training, []


# --------------------------------------------------------------------------- worker
def export_model(cfg: Config, model, args, in_names, out_names, training, dynamic: bool):
    import onnx
    import torch

    dynamic_axes = None
    if dynamic:
        first = {0: "batch", 1: "seq"} if cfg.family in SEQUENCE_FAMILIES else {0: "batch"}
        dynamic_axes = {in_names[0]: first, **{name: {0: f"{name}_rows"} for name in out_names}}
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model,
            args,
            buffer,
            dynamo=False,
            opset_version=cfg.opset,
            input_names=in_names,
            output_names=out_names,
            training=training,
            do_constant_folding=False,
            dynamic_axes=dynamic_axes,
        )
    return onnx.load_from_string(buffer.getvalue())


def concrete_dims(exported, model, args) -> Dict[str, int]:
    """The example's size of every symbolic dim of the exported model's inputs and outputs."""
    import torch

    with torch.no_grad():
        outputs = model(*args)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    sizes: Dict[str, int] = {}
    for infos, tensors in ((exported.graph.input, args), (exported.graph.output, outputs)):
        for info, tensor in zip(infos, tensors):
            for axis, dim in enumerate(info.type.tensor_type.shape.dim):
                if dim.dim_param:
                    sizes[dim.dim_param] = int(tensor.shape[axis])
    return sizes


def ort_generate(prepared, arguments: Dict[str, Any], directory: pathlib.Path) -> None:
    import onnx
    from onnxruntime.training import artifacts, onnxblock

    optimizer = arguments["optimizer"]
    if isinstance(optimizer, dict):
        ((kind, options),) = optimizer.items()
        optimizer = getattr(onnxblock.optim, kind)(**options)
    else:
        optimizer = artifacts.OptimType[optimizer]
    artifacts.generate_artifacts(
        prepared,
        requires_grad=arguments["requires_grad"],
        frozen_params=arguments["frozen_params"],
        loss=artifacts.LossType[arguments["loss"]],
        optimizer=optimizer,
        artifact_directory=str(directory),
        **arguments["kwargs"],
    )
    for path in sorted(directory.glob("*.onnx")):  # what ORT needs to load its own files (see prepare_for_artifacts)
        model = onnx.load(str(path))
        if path.name == "eval_model.onnx":
            prep.prune_batchnorm_outputs(model.graph)
        prep.set_ir_version(model)
        onnx.save(model, str(path))


def scenario_spec(
    cfg: Config,
    directory: pathlib.Path,
    params: List[str],
    kinds: Dict[str, Any],
    arguments: Dict[str, Any],
    concrete: Dict[str, int],
) -> Dict[str, Any]:
    import onnx

    train_m = onnx.load(str(directory / "training_model.onnx"))
    eval_m = onnx.load(str(directory / "eval_model.onnx"))
    inputs = []
    for info in reference.user_inputs(train_m, params):
        tensor = info.type.tensor_type
        shape = [d.dim_value if d.HasField("dim_value") else concrete[d.dim_param] for d in tensor.shape.dim]
        kind, high = reference.feed_kind(info.name, kinds, train_m, eval_m, cfg.loss)
        inputs.append(
            {
                "name": info.name,
                "shape": shape,
                "dtype": reference.onnx_dtype_name(tensor.elem_type),
                "kind": kind,
                "high": high,
            }
        )
    return {
        "name": cfg.name,
        "family": cfg.family,
        "loss": cfg.loss,
        "optimizer": cfg.optim,
        "opset": cfg.opset,
        "lr": reference.LR[cfg.optim],
        "seed": reference.seed_of(cfg.name),
        "steps": 5,
        "accumulate_step": 2,
        "nominal": bool(arguments["kwargs"].get("nominal_checkpoint")),
        "inputs": inputs,
        "eval_inputs": [i.name for i in reference.user_inputs(eval_m, params)],
        "trainable_params": arguments["requires_grad"],
        "frozen_params": arguments["frozen_params"],
        "param_order": [i.name for i in train_m.graph.input if i.name in params],
        "param_shapes": {
            i.name: [d.dim_value for d in i.type.tensor_type.shape.dim] for i in train_m.graph.input if i.name in params
        },
    }


def run_ort_scenario(api, directory: pathlib.Path, spec: Dict[str, Any], seed: Optional[int]):
    """The scenario, with ORT's random generator seeded first when the model draws random masks."""
    if seed is not None:
        from onnxruntime.capi import _pybind_state

        _pybind_state.set_seed(seed)
    return scenario.run_scenario(api, directory, spec)
