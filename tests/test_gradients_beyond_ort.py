"""Training what ORT 1.19.2's generate_artifacts cannot (issue 27, item 3).

ORT's own generator has no gradient for InstanceNormalization (GroupNorm), Einsum,
ReduceMax/ReduceMin, Softplus, CastLike, Resize (upsampling), ConvTranspose and sequences
(the dynamo exporter's ``torch.split``/``chunk``: SplitToSequence + SequenceAt); ours builds
them (and ReduceL2, Tile, ScatterElements, ScatterND, GatherND) from standard ONNX ops.  For each, a small torch
model is exported (TorchScript exporter, opset 17 unless said), our ``generate_artifacts``
makes the artifacts, and the parameter gradients of one train step must match float64
eager torch: within 1e-4 of the largest gradient magnitude, or no farther than float32
eager torch is.  ``ort_torch_compat.api`` trains the artifacts; live (onnxruntime-training
importable), ORT 1.19.2 trains the same artifacts, running our gradient graph, to the same
gradients.
"""

from __future__ import annotations

import contextlib
import io
import pathlib
import warnings
from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402

from ort_torch_compat import artifacts, onnxblock  # noqa: E402

RELATIVE_TOLERANCE = 1e-4


class Lambda(nn.Module):
    """A module whose forward is ``function(self, x)``, with parameters given by name."""

    def __init__(self, function: Callable, **params: torch.Tensor):
        super().__init__()
        self.function = function
        for name, value in params.items():
            setattr(self, name, nn.Parameter(value))

    def forward(self, x):
        return self.function(self, x)


def _p(*shape, seed: int = 0, scale: float = 1.0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator) * scale


@dataclass
class ModelCase:
    name: str
    make: Callable[[], nn.Module]
    input_shape: Tuple[int, ...]
    opset: int = 17
    ops: Tuple[str, ...] = ()  # ops the export must contain (the point of the case)
    exporter: str = "torchscript"  # or "dynamo", or "hand" (``build`` writes the graph)
    build: Optional[Callable[[nn.Module, Tuple[int, ...]], onnx.ModelProto]] = None
    optimize: bool = True  # dynamo: False keeps the graph as exported (its optimizer turns sequences into Split)


def _seq(layers) -> Callable[[], nn.Module]:
    def make():
        torch.manual_seed(7)
        return nn.Sequential(*layers())

    return make


def _cast_like_graph(model: nn.Module, input_shape: Tuple[int, ...]) -> onnx.ModelProto:
    """``y = CastLike(CastLike(x * w, <double>) ** 2, x)``: the float64 square of a float32 product.

    (The TorchScript exporter writes Cast for ``.to(dtype)``; CastLike comes from dynamo
    exports' onnxscript functions, so the graph is written by hand.)"""
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["h"]),
        helper.make_node("CastLike", ["h", "like"], ["d"]),
        helper.make_node("Mul", ["d", "d"], ["e"]),
        helper.make_node("CastLike", ["e", "x"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "cast_like",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, list(input_shape))],
        [
            numpy_helper.from_array(model.w.detach().numpy(), "w"),
            numpy_helper.from_array(np.zeros((), np.float64), "like"),
        ],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _split_to_sequence_graph(model: nn.Module, input_shape: Tuple[int, ...]) -> onnx.ModelProto:
    """``s = SplitToSequence(x * w, axis=0, keepdims=0)`` (no split: one piece per row, squeezed);
    ``y = s[0] * s[2] + s[-1]``, positions as Constant nodes (the form our rewrite to Split takes)."""
    nodes = [
        helper.make_node("Mul", ["x", "w"], ["h"]),
        helper.make_node("SplitToSequence", ["h"], ["seq"], axis=0, keepdims=0),
    ]
    for k, place in enumerate((0, 2, -1)):
        nodes += [
            helper.make_node("Constant", [], [f"p{k}"], value=numpy_helper.from_array(np.array(place, np.int64))),
            helper.make_node("SequenceAt", ["seq", f"p{k}"], [f"r{k}"]),
        ]
    nodes += [helper.make_node("Mul", ["r0", "r1"], ["m"]), helper.make_node("Add", ["m", "r2"], ["y"])]
    graph = helper.make_graph(
        nodes,
        "split_to_sequence",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(input_shape))],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [input_shape[1]])],
        [numpy_helper.from_array(model.w.detach().numpy(), "w")],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


class IndexingModel(nn.Module):
    """split/chunk (SplitToSequence + SequenceAt), advanced indexing (GatherND) and index_put with and
    without accumulate (ScatterND, reduction none and add), as the dynamo exporter writes them."""

    def __init__(self):
        super().__init__()
        self.w = nn.Parameter(_p(4, 6, seed=17))
        self.b = nn.Parameter(_p(3, 6, seed=18))

    def forward(self, x):
        h = x @ self.w
        a, b, c = h.split(2, dim=-1)
        chunks = h.chunk(3, dim=-1)
        picked = h[torch.tensor([0, 2, 0]), torch.tensor([1, 3, 1])]
        z = self.b.clone()
        z[torch.tensor([0, 2])] = h[:2] * 2
        z = z.index_put((torch.tensor([1, 1]),), h[2:4] * self.b[0], accumulate=True)
        return torch.cat([(a * b + c + chunks[1]).sum(0), picked, z.sum(0) * h[0]])


class DynamoModel(nn.Module):
    """GroupNorm, Softplus, bilinear upsampling, amax and an einsum, as the dynamo exporter writes them."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(9)
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.norm = nn.GroupNorm(2, 4, affine=False)  # (dynamo folds the affine parameters into constants)
        self.w = nn.Parameter(_p(4, seed=15))

    def forward(self, x):
        h = F.interpolate(F.softplus(self.norm(self.conv(x))), scale_factor=2, mode="bilinear")
        return torch.amax(h, dim=1) + torch.einsum("bchw,c->bhw", h, self.w)


CASES: List[ModelCase] = [
    ModelCase(
        "groupnorm",
        _seq(lambda: [nn.Conv2d(3, 8, 3, padding=1), nn.GroupNorm(2, 8), nn.SiLU()]),
        (2, 3, 5, 5),
        ops=("InstanceNormalization",),
    ),
    ModelCase(
        "instancenorm_affine",
        _seq(lambda: [nn.Conv1d(3, 4, 3), nn.InstanceNorm1d(4, affine=True)]),
        (2, 3, 9),
        ops=("InstanceNormalization",),
    ),
    ModelCase(
        "einsum_batch_matmul_and_summed_index",
        lambda: Lambda(
            lambda m, x: (
                torch.einsum("bij,jk,kl->bil", x, m.a, m.b).tanh() + torch.einsum("bij,jk->bi", x, m.c).unsqueeze(-1)
            ),
            a=_p(4, 5, seed=1),
            b=_p(5, 3, seed=2),
            c=_p(4, 6, seed=3),
        ),
        (2, 3, 4),
        ops=("Einsum",),
    ),
    ModelCase(
        "einsum_ellipsis_outer_broadcast",
        lambda: Lambda(
            lambda m, x: (
                torch.einsum("...ij,...jk->...ik", x, m.a)
                + torch.einsum("i,j->ij", m.u, m.v)
                + torch.einsum("ij->j", m.w)
            ),
            a=_p(1, 4, 3, seed=4),
            u=_p(3, seed=5),
            v=_p(3, seed=6),
            w=_p(2, 3, seed=7),
        ),
        (2, 3, 4),
        ops=("Einsum",),
    ),
    ModelCase(
        "reduce_max_min_ties",
        lambda: Lambda(
            lambda m, x: (
                torch.amax(torch.clamp(x * m.w, max=0.4), dim=1)
                + torch.amin(x * m.w, dim=(0, 1), keepdim=True)[0, 0]
                + torch.amax(x * m.v)
            ),
            w=_p(5, seed=8),
            v=_p(5, seed=9),
        ),
        (3, 4, 5),
        ops=("ReduceMax", "ReduceMin"),
    ),
    ModelCase(
        "reduce_max_opset18",
        lambda: Lambda(lambda m, x: torch.amax(x * m.w, dim=-1, keepdim=True) * m.w, w=_p(5, seed=10)),
        (3, 4, 5),
        opset=18,
        ops=("ReduceMax",),
    ),
    ModelCase(
        "softplus",
        lambda: Lambda(lambda m, x: F.softplus(x * m.w) + F.softplus(x, beta=2.0) * m.w, w=_p(5, seed=11, scale=3.0)),
        (3, 5),
        ops=("Softplus",),
    ),
    ModelCase(
        "interpolate_nearest_x2",
        _seq(lambda: [nn.Conv2d(2, 3, 3, padding=1), nn.Upsample(scale_factor=2), nn.Conv2d(3, 2, 3)]),
        (2, 2, 4, 5),
        ops=("Resize",),
    ),
    ModelCase(
        "interpolate_bilinear",
        _seq(lambda: [nn.Conv2d(2, 3, 3, padding=1), nn.Upsample(scale_factor=2, mode="bilinear"), nn.Conv2d(3, 2, 3)]),
        (2, 2, 4, 5),
        ops=("Resize",),
    ),
    ModelCase(
        "interpolate_bilinear_align_corners_size",
        _seq(
            lambda: [
                nn.Conv2d(2, 3, 3, padding=1),
                nn.Upsample(size=(7, 9), mode="bilinear", align_corners=True),
                nn.Conv2d(3, 2, 3),
            ]
        ),
        (2, 2, 4, 5),
        ops=("Resize",),
    ),
    ModelCase(
        "conv_transpose_stride_padding_groups",
        _seq(
            lambda: [
                nn.ConvTranspose2d(4, 6, 3, stride=2, padding=1, output_padding=1, groups=2),
                nn.Tanh(),
                nn.ConvTranspose2d(6, 2, (2, 3), stride=(1, 2), padding=(0, 1), dilation=2),
            ]
        ),
        (2, 4, 3, 4),
        ops=("ConvTranspose",),
    ),
    ModelCase(
        "reduce_l2_tile_scatter",
        lambda: Lambda(
            lambda m, x: (
                torch.norm(x * m.w, dim=1).repeat(2, 3)
                + m.t.repeat(1, 3).sum()
                + torch.scatter(m.d, 1, torch.tensor([[0, 2], [1, 0]]), x[:2, :2] * 2.0).sum()
                + torch.scatter_add(m.d, 1, torch.tensor([[0, 0], [1, 2]]), x[:2, :2] * m.w[:2]).sum()
            ),
            w=_p(4, seed=12),
            t=_p(2, 2, seed=13),
            d=_p(2, 3, seed=14),
        ),
        (3, 4),
        opset=17,
        ops=("ReduceL2", "Tile", "ScatterElements"),
    ),
    ModelCase(
        "cast_like",
        lambda: Lambda(lambda m, x: ((x * m.w).double() ** 2).to(x.dtype), w=_p(4, seed=16)),
        (3, 4),
        ops=("CastLike",),
        exporter="hand",
        build=_cast_like_graph,
    ),
    ModelCase(
        "split_to_sequence_keepdims0",
        lambda: Lambda(lambda m, x: (x * m.w)[0] * (x * m.w)[2] + (x * m.w)[-1], w=_p(4, seed=19)),
        (3, 4),
        ops=("SplitToSequence", "SequenceAt"),
        exporter="hand",
        build=_split_to_sequence_graph,
    ),
    ModelCase(
        "dynamo_sequences_gather_scatter_nd",
        IndexingModel,
        (5, 4),
        opset=18,
        exporter="dynamo",
        optimize=False,
        ops=("SplitToSequence", "SequenceAt", "GatherND", "ScatterND"),
    ),
    ModelCase(
        "dynamo_export",
        DynamoModel,
        (2, 3, 4, 4),
        opset=18,
        exporter="dynamo",
        ops=("InstanceNormalization", "Softplus", "Resize", "ReduceMax", "Einsum"),
    ),
]


def _export(case: ModelCase, model: nn.Module, x: torch.Tensor) -> onnx.ModelProto:
    if case.exporter == "hand":
        return case.build(model, tuple(x.shape))
    buffer = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        if case.exporter == "dynamo":
            pytest.importorskip("onnxscript", reason="the dynamo exporter needs onnxscript")
            with contextlib.redirect_stdout(io.StringIO()):
                program = torch.onnx.export(
                    model,
                    (x,),
                    dynamo=True,
                    opset_version=case.opset,
                    input_names=["x"],
                    output_names=["y"],
                    optimize=case.optimize,
                )
            return program.model_proto
        torch.onnx.export(
            model,
            (x,),
            buffer,
            dynamo=False,
            opset_version=case.opset,
            input_names=["x"],
            output_names=["y"],
            do_constant_folding=False,
            training=torch.onnx.TrainingMode.TRAINING,
        )
    return onnx.load_from_string(buffer.getvalue())


def _torch_grads(model: nn.Module, x: np.ndarray, target: np.ndarray, dtype) -> Dict[str, np.ndarray]:
    model = model.to(dtype)
    model.zero_grad()
    y = model(torch.from_numpy(x).to(dtype))
    F.mse_loss(y, torch.from_numpy(target).to(dtype)).backward()
    grads = {n: p.grad.detach().double().numpy().copy() for n, p in model.named_parameters()}
    model.float()
    return grads


def _module_grads(api, directory: pathlib.Path, feeds: Dict[str, np.ndarray], params: List[str], **options):
    state = api.CheckpointState.load_checkpoint(str(directory / "checkpoint"))
    module = api.Module(str(directory / "training_model.onnx"), state, str(directory / "eval_model.onnx"), **options)
    module.train()
    module(*[feeds[name] for name in module.input_names()])
    return {p: np.array(state.parameters[p].grad, dtype=np.float64) for p in params}


_PREPARED: Dict[str, tuple] = {}
_EXPORTED: Dict[str, onnx.ModelProto] = {}


def _prepare(case: ModelCase, root: pathlib.Path):
    """(artifact directory, feeds, parameter names, float64 and float32 torch gradients), once per case."""
    if case.name in _PREPARED:
        return _PREPARED[case.name]
    model = case.make()
    x = np.random.default_rng([27, len(case.name)]).standard_normal(case.input_shape).astype(np.float32)
    exported = _export(case, model, torch.from_numpy(x))
    present = {n.op_type for n in exported.graph.node}
    missing = [op for op in case.ops if op not in present]
    assert not missing, f"the export has no {missing} (ops: {sorted(present)})"
    with torch.no_grad():
        y = model(torch.from_numpy(x))
    target = np.random.default_rng([28, len(case.name)]).standard_normal(tuple(y.shape)).astype(np.float32)
    params = [n for n, _ in model.named_parameters()]
    initializers = {i.name for i in exported.graph.initializer}
    assert set(params) <= initializers, f"parameters not exported by name: {set(params) - initializers}"
    directory = root / case.name
    directory.mkdir()
    onnxblock.reset_name_counter()
    artifacts.generate_artifacts(
        exported,
        requires_grad=params,
        loss=artifacts.LossType.MSELoss,
        optimizer=artifacts.OptimType.SGD,
        artifact_directory=str(directory),
    )
    reference = _torch_grads(model, x, target, torch.float64)
    single = _torch_grads(model, x, target, torch.float32)
    _PREPARED[case.name] = (directory, {"x": x, "target": target}, params, reference, single)
    _EXPORTED[case.name] = exported
    return _PREPARED[case.name]


def _check(got: Dict[str, np.ndarray], reference, single, label: str, expected=None) -> None:
    """``got`` within 1e-4 of ``expected`` (default: the float64 ``reference``) relative to the largest
    float64 gradient magnitude, or no farther than twice float32 torch is from float64 torch."""
    expected = reference if expected is None else expected
    for name, exact in reference.items():
        scale = max(float(np.abs(exact).max()), 1e-12)
        error = float(np.abs(got[name] - expected[name]).max()) / scale
        float32_error = float(np.abs(single[name] - exact).max()) / scale
        assert error <= max(RELATIVE_TOLERANCE, 2 * float32_error), (
            f"{label}: gradient of {name!r} off by {error:.3g} of its largest magnitude (float32 torch: "
            f"{float32_error:.3g})"
        )


_OURS: Dict[str, Dict[str, np.ndarray]] = {}


def _our_grads(case: ModelCase, root: pathlib.Path) -> Dict[str, np.ndarray]:
    """One train step of ``ort_torch_compat.api`` on our artifacts, once per case.

    ``gradients="exact"``: by default the api reproduces ORT's own builder's ScatterElements
    gradient, which ignores reduction="add"; our builder (and ORT running our artifacts)
    honours it."""
    import ort_torch_compat.api as ours

    if case.name not in _OURS:
        directory, feeds, params, _, _ = _prepare(case, root)
        _OURS[case.name] = _module_grads(ours, directory, feeds, params, gradients="exact")
    return _OURS[case.name]


@pytest.fixture(scope="module")
def artifact_root(tmp_path_factory):
    return tmp_path_factory.mktemp("beyond_ort")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_ours_trains_to_float64_torch_gradients(case, artifact_root):

    directory, feeds, params, reference, single = _prepare(case, artifact_root)
    _check(_our_grads(case, artifact_root), reference, single, "ort_torch_compat.api")


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_live_ort_trains_our_artifacts(case, artifact_root, ort_api):
    import onnxruntime

    onnxruntime.set_default_logger_severity(3)
    directory, feeds, params, reference, single = _prepare(case, artifact_root)
    got = _module_grads(ort_api, directory, feeds, params)
    _check(got, reference, single, "onnxruntime-training")
    _check(
        got,
        reference,
        single,
        "onnxruntime-training versus ort_torch_compat.api",
        expected=_our_grads(case, artifact_root),
    )


def _single_node_model(node: onnx.NodeProto, inputs, params: Dict[str, np.ndarray], opset: int = 17):
    graph = helper.make_graph(
        [node],
        "refused",
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
        [numpy_helper.from_array(v, k) for k, v in params.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


REFUSED = [
    (
        "einsum_diagonal",
        helper.make_node("Einsum", ["w", "x"], ["y"], equation="ii,ij->ij"),
        [("x", [3, 4])],
        {"w": np.ones((3, 3), np.float32)},
        "index repeated within operand 0",
    ),
    (
        "resize_antialias",
        helper.make_node("Resize", ["w", "", "s"], ["y"], mode="linear", antialias=1),
        [],
        {"w": np.ones((1, 1, 4, 4), np.float32), "s": np.array([1, 1, 0.5, 0.5], np.float32)},
        "antialias",
    ),
    (
        "conv_transpose_auto_pad",
        helper.make_node("ConvTranspose", ["x", "w"], ["y"], auto_pad="SAME_UPPER", strides=[2, 2]),
        [("x", [1, 2, 3, 3])],
        {"w": np.ones((2, 2, 3, 3), np.float32)},
        "auto_pad",
    ),
    (
        "scatter_mul",
        helper.make_node("ScatterElements", ["w", "i", "w2"], ["y"], reduction="mul"),
        [],
        {"w": np.ones((2, 2), np.float32), "i": np.zeros((1, 2), np.int64), "w2": np.ones((1, 2), np.float32)},
        "reduction='mul'",
    ),
    (
        "scatter_nd_max",
        helper.make_node("ScatterND", ["w", "i", "w2"], ["y"], reduction="max"),
        [],
        {"w": np.ones((2, 2), np.float32), "i": np.zeros((1, 1), np.int64), "w2": np.ones((1, 2), np.float32)},
        "reduction='max'",
    ),
    (
        "gather_nd_batch_dims",
        helper.make_node("GatherND", ["w", "i"], ["y"], batch_dims=1),
        [],
        {"w": np.ones((2, 3), np.float32), "i": np.zeros((2, 1), np.int64)},
        "batch_dims > 0",
    ),
]


@pytest.mark.parametrize("name, node, inputs, params, reason", REFUSED, ids=[r[0] for r in REFUSED])
def test_unsupported_configurations_are_refused_by_name(name, node, inputs, params, reason, tmp_path):
    model = _single_node_model(node, inputs, params, opset=18)
    trainable = [k for k, v in params.items() if v.dtype == np.float32 and k != "s"]
    with pytest.raises(artifacts.UnsupportedGradientError, match=reason.replace("(", r"\(").replace("[", r"\[")):
        artifacts.generate_artifacts(
            model,
            requires_grad=trainable,
            loss=artifacts.LossType.MSELoss,
            optimizer=artifacts.OptimType.SGD,
            artifact_directory=str(tmp_path),
        )
    assert not any(tmp_path.iterdir())


# What ORT 1.19.2 does with the same exports (measured): its generator has no builder, or writes
# a gradient op its CPU build has no kernel for, or writes an invalid graph.
ORT_OWN_FAILURES = {
    "groupnorm": "gradient builder has not been registered: InstanceNormalization",
    "einsum_batch_matmul_and_summed_index": "gradient builder has not been registered: Einsum",
    "reduce_max_min_ties": "gradient builder has not been registered: ReduceMax",
    "softplus": "gradient builder has not been registered: Softplus",
    "cast_like": "gradient builder has not been registered: CastLike",
    "reduce_l2_tile_scatter": "has input size 1 not in range",  # ReduceL2 keepdims=0: Unsqueeze-1 form at opset 17
    "interpolate_bilinear": "Could not find an implementation for ResizeGrad",
    "conv_transpose_stride_padding_groups": "Could not find an implementation for ConvTransposeGrad",
    "split_to_sequence_keepdims0": "unreachable",  # its gradient graph stops at the sequence
}


@pytest.mark.parametrize("name", sorted(ORT_OWN_FAILURES))
def test_live_ort_own_artifacts_cannot_train_these(name, artifact_root, ort_api, tmp_path):
    """The premise, live: ORT's own generate_artifacts (and training runtime, CPU) on the same exports."""
    import onnxruntime
    from onnxruntime.training import artifacts as ort_artifacts

    onnxruntime.set_default_logger_severity(4)
    case = next(c for c in CASES if c.name == name)
    _, feeds, params, _, _ = _prepare(case, artifact_root)
    model = onnx.ModelProto()
    model.CopyFrom(_EXPORTED[name])
    model.ir_version = min(model.ir_version, 10)  # onnx >= 1.17 writes IR versions ORT 1.19 refuses
    with pytest.raises(Exception, match=ORT_OWN_FAILURES[name]):
        with contextlib.redirect_stdout(io.StringIO()):
            ort_artifacts.generate_artifacts(
                model,
                requires_grad=params,
                loss=ort_artifacts.LossType.MSELoss,
                optimizer=ort_artifacts.OptimType.SGD,
                artifact_directory=str(tmp_path),
            )
        _module_grads(ort_api, tmp_path, feeds, params)
