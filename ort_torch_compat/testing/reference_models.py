"""The tiny torch models of the parity fixtures and the helpers that record them.

``build_model(family, loss)`` builds each fixture family's model (seeded by ``seed_of`` the
config name); ``LR`` is the learning rate per optimizer; ``user_inputs``, ``onnx_dtype_name``
and ``output_last_dim`` describe a generated model's inputs for the scenario spec; ``save_npz``
writes byte-reproducible ``expected.npz`` files.  Used by ``scripts/make_reference.py``,
``scripts/make_artifact_fixtures.py`` and ``scripts/make_real_arch_reference.py``, and by the
tests that re-export a fixture model.  torch and onnx are imported by the functions that need them.
"""

from __future__ import annotations

import io
import pathlib
import zlib
from typing import Any, Dict, List, Tuple

LR = {"adamw": 0.05, "sgd": 0.1}


def seed_of(name: str) -> int:
    return zlib.crc32(name.encode()) % (2**31)


def build_model(family: str, loss: str):
    """Return (module, example_args, input_names, output_names, input_kinds, export_training, frozen_torch).

    ``input_kinds`` maps model input name -> (kind, high); ``frozen_torch`` lists torch
    parameter names that go to ``frozen_params``.
    """
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    ce = loss == "ce"
    dout = 3
    frozen: List[str] = []
    training = torch.onnx.TrainingMode.EVAL

    class MLP(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(6, 12)
            self.fc2 = nn.Linear(12, 8)
            self.fc3 = nn.Linear(8, dout)

        def forward(self, x):
            h = F.gelu(self.fc1(x))  # erf GELU
            h = torch.tanh(self.fc2(h))
            return self.fc3(h)

    class TwoOut(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc1 = nn.Linear(6, 12)
            self.fc2 = nn.Linear(12, 8)
            self.fc3 = nn.Linear(8, dout)

        def forward(self, x):
            h = torch.tanh(self.fc2(F.gelu(self.fc1(x))))
            y = self.fc3(h)
            aux = torch.sigmoid(y) * 0.5 + h[:, :dout]
            return y, aux

    class CNN(nn.Module):
        def __init__(self):
            super().__init__()
            # No bias before BN: its gradient is mathematically zero (BN removes the mean), so
            # ORT's gradient is rounding noise that AdamW's m/sqrt(v) turns into lr-sized steps
            # in arbitrary directions, which then leak into bn.running_mean; such a reference
            # cannot be reproduced by another implementation.  conv2 keeps its bias.
            self.conv1 = nn.Conv2d(2, 4, 3, padding=1, bias=False)
            self.bn = nn.BatchNorm2d(4)
            self.pool = nn.MaxPool2d(2)
            self.conv2 = nn.Conv2d(4, 4, 3, padding=1)
            self.avg = nn.AvgPool2d(3)
            self.fc = nn.Linear(4, dout)

        def forward(self, x):
            h = self.pool(F.relu(self.bn(self.conv1(x))))
            h = self.avg(self.conv2(h))
            return self.fc(torch.flatten(h, 1))

    class Transformer(nn.Module):
        def __init__(self, vocab=11, seq=5, d=8, ncls=5):
            super().__init__()
            self.emb = nn.Embedding(vocab, d)
            self.pos = nn.Parameter(torch.randn(1, seq, d) * 0.1)
            self.enc = nn.TransformerEncoderLayer(
                d, 2, dim_feedforward=16, dropout=0.0, activation="gelu", batch_first=True
            )
            self.ln = nn.LayerNorm(d)
            self.head = nn.Linear(d, ncls if ce else dout)
            self.ncls = ncls

        def forward(self, ids):
            h = self.enc(self.emb(ids) + self.pos)
            y = self.head(self.ln(h))
            if ce:  # per-token logits flattened to (B*S, V): ORT's CE wants classes last
                y = y.reshape(-1, self.ncls)
            return y

    class RNN(nn.Module):
        def __init__(self, cell):
            super().__init__()
            self.rnn = cell(5, 8, batch_first=True)
            self.fc = nn.Linear(8, dout)

        def forward(self, x):
            out, _ = self.rnn(x)
            return self.fc(out[:, -1, :])

    class TensorOps(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(6, 8)
            self.scale = nn.Parameter(torch.tensor([[[1.5, -0.5]]]))
            self.head = nn.Linear(6, dout)

        def forward(self, x):
            h = self.fc(x)  # (4, 8)
            a = h.reshape(4, 2, 4).transpose(1, 2)  # Reshape, Transpose -> (4, 4, 2)
            s = self.scale.expand(4, 4, 2)  # Expand of a learnable param
            b = torch.cat([a, a * s], dim=2)  # Concat -> (4, 4, 4)
            p, q = torch.split(b, [1, 3], dim=2)  # Split
            c = q[:, 1:3, :]  # Slice -> (4, 2, 3)
            w = torch.where(c > 0, c, 0.1 * c) + p[:, :2, :]  # Where (+ broadcast)
            return self.head(w.reshape(4, 6))

    x_mlp = (torch.randn(4, 6),)
    kinds: Dict[str, Tuple[str, int]] = {"x": ("normal", 0)}
    out_names = ["y"]
    if family == "mlp":
        m, args = MLP(), x_mlp
    elif family == "frozen":
        m, args = MLP(), x_mlp
        frozen = ["fc2.weight", "fc2.bias"]  # a frozen layer in the middle
    elif family == "twoout":
        m, args = TwoOut(), x_mlp
        out_names = ["y", "aux"]
    elif family == "cnn":
        m, args = CNN(), (torch.randn(4, 2, 6, 6),)
        training = torch.onnx.TrainingMode.TRAINING  # BN uses batch stats
    elif family == "transformer":
        m, args = Transformer(), (torch.randint(0, 11, (2, 5)),)
        kinds = {"x": ("int", 11)}
    elif family == "gru":
        m, args = RNN(nn.GRU), (torch.randn(3, 4, 5),)
    elif family == "lstm":
        m, args = RNN(nn.LSTM), (torch.randn(3, 4, 5),)
    elif family == "tensorops":
        m, args = TensorOps(), x_mlp
    else:
        raise ValueError(family)
    # Perturb every parameter so no two initializers are equal (the TorchScript
    # exporter de-duplicates equal initializers into Identity nodes) and BN stats
    # are non-trivial.
    with torch.no_grad():
        for p in m.parameters():
            p.add_(torch.randn_like(p) * 0.05)
        for name, b in m.named_buffers():
            if name.endswith("running_mean"):
                b.copy_(torch.randn_like(b) * 0.1)
            elif name.endswith("running_var"):
                b.copy_(1.0 + torch.rand_like(b) * 0.5)
    return m, args, ["x"], out_names, kinds, training, frozen


def onnx_dtype_name(elem_type: int) -> str:
    import onnx

    return str(onnx.helper.tensor_dtype_to_np_dtype(elem_type))


def user_inputs(model, params: List[str]) -> List[Any]:
    suffixes = ("_grad.accumulation.buffer", "_grad", "_grad.accumulation.out")
    res = []
    for vi in model.graph.input:
        if vi.name in params or vi.name == "lazy_reset_grad" or vi.name.endswith(suffixes):
            continue
        res.append(vi)
    return res


def output_last_dim(train_m, eval_m) -> int:
    """Number of classes for CE labels: last dim of the loss input (the model output 'y')."""
    import onnx

    for g in (eval_m.graph, train_m.graph):
        for n in g.node:
            if n.op_type == "SoftmaxCrossEntropyLoss":
                scores = n.input[0]
                vis = {v.name: v for v in list(g.value_info) + list(g.output) + list(g.input)}
                if scores in vis:
                    return vis[scores].type.tensor_type.shape.dim[-1].dim_value
                inferred = onnx.shape_inference.infer_shapes(eval_m)
                for v in list(inferred.graph.value_info) + list(inferred.graph.output):
                    if v.name == scores:
                        return v.type.tensor_type.shape.dim[-1].dim_value
    raise RuntimeError("cannot determine the number of classes")


def feed_kind(name: str, kinds: Dict[str, Any], train_m, eval_m, loss: str) -> Tuple[str, int]:
    """How the scenario fills the user input `name`: (kind, high) from the config's `kinds`, else
    class indices for `labels`, 0/1 targets for a BCE `target`, normal values otherwise."""
    if name in kinds:
        kind, high = kinds[name]
        return kind, high
    if name == "labels":
        return "int", int(output_last_dim(train_m, eval_m))
    if name == "target" and loss == "bce":
        return "binary", 0
    return "normal", 0


def save_npz(path: pathlib.Path, arrays: Dict[str, Any]) -> None:
    """Like ``np.savez_compressed`` but byte-reproducible (fixed zip timestamps, sorted keys)."""
    import zipfile

    import numpy as np

    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for key in sorted(arrays):
            bio = io.BytesIO()
            np.lib.format.write_array(bio, np.asanyarray(arrays[key]), allow_pickle=False)
            info = zipfile.ZipInfo(key + ".npy", date_time=(1980, 1, 1, 0, 0, 0))
            info.compress_type = zipfile.ZIP_DEFLATED
            info.external_attr = 0o644 << 16
            zf.writestr(info, bio.getvalue(), compresslevel=9)
