"""Make a ``torch.onnx.export`` model acceptable to onnxruntime-training 1.19.2.

Usable as a module (``prepare_model``, ``prepare_eval_model``, ``set_ir_version``)
and as a CLI::

    python scripts/prepare_for_artifacts.py in.onnx out.onnx [--ir-version 10]

Why each edit exists (all measured with onnxruntime-training 1.19.2, onnx 1.23,
torch 2.15; see /work/shared/spec/onnx2torch-findings.md, "ORT-side findings"):

* **LayerNormalization (ai.onnx, opset >= 17).** The torch exporter emits one
  output per LN node.  ORT's gradient builder for LayerNormalization reads the
  optional outputs 1 (Mean) and 2 (InvStdDev) unconditionally, so
  ``generate_artifacts`` dies with ``GradientBuilderBase::O ... i <
  node_->OutputDefs().size() was false`` (microsoft/onnxruntime#19427).  We
  append two fresh, graph-unique output names to every LN node that has fewer
  than three outputs.  Consequence: the generated training *and* eval models
  contain 3-output LN nodes.

* **BatchNormalization exported in TRAINING mode.** The exporter emits
  ``training_mode=1`` with 3 outputs (Y, running_mean, running_var); the two
  extra outputs are consumed by nothing.  They must stay in the model given to
  ``generate_artifacts``: ONNX shape inference (run by onnxblock's checker)
  insists on 3 outputs when ``training_mode=1`` ("This number of op outputs
  should be 3 when Training_mode = True"), and ORT lowers the node to
  com.microsoft ``BatchNormInternal``, which updates the running statistics in
  place.  ``generate_artifacts`` then writes the eval model with
  ``training_mode=0`` but keeps the 3 outputs, and ORT refuses to load that
  eval model: ``number of op outputs should be 1 when Training_mode = False``.
  So the pruning is done *after* generation, on the eval model only
  (``prepare_eval_model``, or ``--eval`` on the CLI).  ``prepare_model`` only
  prunes BN nodes that are already in inference mode (``training_mode`` 0 or
  absent) and still carry unused extra outputs.

* **CastLike (the dynamo exporter).** ``torch.onnx.export(dynamo=True)`` writes
  ``CastLike`` for ``type_as`` and in every BatchNorm (training mode) and attention-mask
  computation; ORT 1.19.2 has no gradient builder for it ("The gradient builder has not
  been registered: CastLike"), so ``generate_artifacts`` fails on BERT, ViT, ResNet...
  Where the type of the second input is known (an initializer, a graph input, a
  ``value_info``, or ONNX shape inference), ``CastLike(x, like)`` is the same function as
  ``Cast(x, to=type(like))``, for which ORT has a gradient; ``castlike_to_cast`` rewrites it.

* **IR version.** onnx >= 1.17 stamps new models (notably the optimizer model
  that ``generate_artifacts`` builds from scratch) with an IR version above 10,
  and ORT 1.19 refuses to load them ("Unsupported model IR version ..., max
  supported IR version: 10").  None of these models use IR>10 features, so we
  lower the field to 10 (never raise it).  Apply ``set_ir_version`` to every
  generated .onnx file too (``patch_ir_version_file``).
"""

from __future__ import annotations

import argparse
import pathlib
from typing import Iterable, List, Optional, Set

import onnx

MAX_ORT_IR_VERSION = 10

_ONNX_DOMAINS = ("", "ai.onnx")


def _all_value_names(graph: onnx.GraphProto) -> Set[str]:
    """Every tensor name used anywhere in ``graph`` (including subgraphs)."""
    names: Set[str] = set()
    for vi in list(graph.input) + list(graph.output) + list(graph.value_info):
        names.add(vi.name)
    for init in graph.initializer:
        names.add(init.name)
    for sp in graph.sparse_initializer:
        names.add(sp.values.name)
    for node in graph.node:
        names.update(n for n in node.input if n)
        names.update(n for n in node.output if n)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                names |= _all_value_names(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    names |= _all_value_names(g)
    return names


def _consumed_names(graph: onnx.GraphProto) -> Set[str]:
    """Names read by some node (or subgraph node) or exported as graph outputs."""
    used: Set[str] = {o.name for o in graph.output}
    for node in graph.node:
        used.update(n for n in node.input if n)
        for attr in node.attribute:
            if attr.type == onnx.AttributeProto.GRAPH:
                used |= _consumed_names(attr.g)
            elif attr.type == onnx.AttributeProto.GRAPHS:
                for g in attr.graphs:
                    used |= _consumed_names(g)
    return used


def _unique(base: str, taken: Set[str]) -> str:
    name, k = base, 0
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def declare_layernorm_outputs(graph: onnx.GraphProto) -> int:
    """Give every ai.onnx LayerNormalization node its optional Mean and InvStdDev outputs.

    ORT 1.19's LayerNormalization gradient builder indexes outputs 1 and 2 without
    checking that they exist; without them generate_artifacts fails.  Returns the
    number of nodes edited.
    """
    taken = _all_value_names(graph)
    edited = 0
    for i, node in enumerate(graph.node):
        if node.op_type != "LayerNormalization" or node.domain not in _ONNX_DOMAINS:
            continue
        if len(node.output) >= 3:
            continue
        stem = node.name or node.output[0] or f"LayerNormalization_{i}"
        if len(node.output) < 2:
            node.output.append(_unique(f"{stem}_mean", taken))
        node.output.append(_unique(f"{stem}_inv_std_dev", taken))
        edited += 1
    return edited


def export_dynamo(model, args: tuple, input_names: List[str], output_name: str, opset: int) -> onnx.ModelProto:
    """``torch.onnx.export(dynamo=True)`` of `model` on `args`, as a ModelProto.  ``optimize=False``:
    the exporter's default optimizer folds Transpose/Reshape of weights into new initializers
    (``val_17``...), and most parameters are then no longer trainable by name."""
    import torch

    program = torch.onnx.export(
        model,
        args,
        dynamo=True,
        opset_version=opset,
        input_names=input_names,
        output_names=[output_name],
        verbose=False,
        optimize=False,
    )
    return program.model_proto


def castlike_to_cast(model: onnx.ModelProto) -> int:
    """Rewrite ai.onnx ``CastLike(x, like)`` as ``Cast(x, to=elem_type(like))`` wherever the
    element type of ``like`` is known (main graph only).  Returns the number of nodes edited."""
    graph = model.graph
    if not any(n.op_type == "CastLike" and n.domain in _ONNX_DOMAINS for n in graph.node):
        return 0
    types = {init.name: init.data_type for init in graph.initializer}
    for vi in list(graph.input) + list(graph.value_info) + list(graph.output):
        if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
            types.setdefault(vi.name, vi.type.tensor_type.elem_type)
    for node in graph.node:
        if node.op_type == "Constant" and node.domain in _ONNX_DOMAINS:
            for attr in node.attribute:
                if attr.name == "value":
                    types.setdefault(node.output[0], attr.t.data_type)
    if any(n.op_type == "CastLike" and n.input[1] not in types for n in graph.node):
        try:
            inferred = onnx.shape_inference.infer_shapes(model)
        except Exception:  # noqa: BLE001 (then only the known ones are rewritten)
            inferred = None
        if inferred is not None:
            for vi in inferred.graph.value_info:
                if vi.type.HasField("tensor_type") and vi.type.tensor_type.elem_type:
                    types.setdefault(vi.name, vi.type.tensor_type.elem_type)
    edited = 0
    for node in graph.node:
        if node.op_type != "CastLike" or node.domain not in _ONNX_DOMAINS or node.input[1] not in types:
            continue
        like = node.input[1]
        del node.input[1]
        saturate = [a for a in node.attribute if a.name == "saturate"]
        del node.attribute[:]
        node.attribute.extend(saturate)
        node.attribute.append(onnx.helper.make_attribute("to", types[like]))
        node.op_type = "Cast"
        edited += 1
    return edited


def _bn_training_mode(node: onnx.NodeProto) -> int:
    for attr in node.attribute:
        if attr.name == "training_mode":
            return int(attr.i)
    return 0


def prune_batchnorm_outputs(graph: onnx.GraphProto, include_training_mode: bool = False) -> int:
    """Drop unused trailing optional outputs (running_mean/var) of inference-mode BatchNormalization nodes.

    A BN node left with 3 outputs and ``training_mode=0`` (what generate_artifacts
    writes into the eval model) fails ONNX shape inference, so ORT cannot load the
    eval model.  Only trailing outputs that are unused (empty name, or consumed by
    no node and not a graph output) are removed, so the graph's meaning is
    unchanged.  Nodes with ``training_mode=1`` are skipped unless
    ``include_training_mode`` (ONNX requires their 3 outputs).  Returns the
    number of outputs removed.
    """
    used = _consumed_names(graph)
    removed = 0
    for node in graph.node:
        if node.op_type != "BatchNormalization" or node.domain not in _ONNX_DOMAINS:
            continue
        if _bn_training_mode(node) and not include_training_mode:
            continue
        while len(node.output) > 1 and (not node.output[-1] or node.output[-1] not in used):
            dropped = node.output[-1]
            del node.output[-1]
            removed += 1
            # keep value_info consistent
            for j in reversed(range(len(graph.value_info))):
                if graph.value_info[j].name == dropped:
                    del graph.value_info[j]
    return removed


def set_ir_version(model: onnx.ModelProto, max_ir: int = MAX_ORT_IR_VERSION) -> onnx.ModelProto:
    """Lower ``model.ir_version`` to at most ``max_ir`` (in place; returns the model).

    ORT 1.19 rejects IR > 10; onnx 1.23 writes newer IR versions by default.
    """
    if model.ir_version > max_ir:
        model.ir_version = max_ir
    return model


def prepare_model(model: onnx.ModelProto, max_ir: int = MAX_ORT_IR_VERSION) -> onnx.ModelProto:
    """Return a copy of a torch-exported ``model`` that generate_artifacts (ORT 1.19.2) accepts.

    Declares LN's two optional outputs, rewrites CastLike of a known type as Cast, prunes
    unused outputs of inference-mode BN nodes (training-mode BN keeps its 3 outputs; fix the generated eval model
    with ``prepare_eval_model``) and lowers the
    IR version; see the module docstring for the reasons.
    """
    out = onnx.ModelProto()
    out.CopyFrom(model)
    declare_layernorm_outputs(out.graph)
    prune_batchnorm_outputs(out.graph)
    castlike_to_cast(out)
    set_ir_version(out, max_ir)
    return out


def prepare_eval_model(model: onnx.ModelProto, max_ir: int = MAX_ORT_IR_VERSION) -> onnx.ModelProto:
    """Post-process a generated eval model so ORT 1.19 can load it (BN pruning + IR)."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    prune_batchnorm_outputs(out.graph)
    set_ir_version(out, max_ir)
    return out


def patch_ir_version_file(path: "str | pathlib.Path", max_ir: int = MAX_ORT_IR_VERSION) -> bool:
    """Rewrite the .onnx file at ``path`` with ir_version <= max_ir. Returns True if changed."""
    path = pathlib.Path(path)
    model = onnx.load(str(path), load_external_data=False)
    if model.ir_version <= max_ir:
        return False
    set_ir_version(model, max_ir)
    onnx.save(model, str(path))
    return True


def main(argv: Optional[Iterable[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input")
    ap.add_argument("output")
    ap.add_argument(
        "--ir-version",
        type=int,
        default=MAX_ORT_IR_VERSION,
        help="upper bound for ir_version (default 10, the most ORT 1.19 loads)",
    )
    ap.add_argument("--eval", action="store_true", help="treat input as a generated eval model (only BN pruning + IR)")
    args = ap.parse_args(list(argv) if argv is not None else None)
    model = onnx.load(args.input)
    fn = prepare_eval_model if args.eval else prepare_model
    onnx.save(fn(model, args.ir_version), args.output)
    return 0
