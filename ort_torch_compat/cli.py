"""`ort-torch-compat`: run ORT scripts unmodified, inspect and convert checkpoints, export.

    ort-torch-compat run SCRIPT [ARGS...]          (or: run -m MODULE [ARGS...])
    ort-torch-compat inspect CHECKPOINT [--json]
    ort-torch-compat to-torch CHECKPOINT OUT.{safetensors,pt} [--optimizer]
    ort-torch-compat from-torch STATE CHECKPOINT OUT [--drop-optimizer] [--allow-pickle]
    ort-torch-compat export ARTIFACTS_DIR OUT.onnx [--outputs NAME...]
    ort-torch-compat compile ARTIFACTS_DIR --input NAME=SHAPE[:DTYPE] ...

Exit status: 0 success, 2 usage error, 1 any other error (one line on stderr naming the
file).  `run` exits with the script's own status.  Progress bars appear only when stderr
is a terminal.  Heavy modules (torch) are imported by the commands that need them, so
`run` of a script that never imports onnxruntime.training stays cheap.
"""

from __future__ import annotations

import argparse
import json
import os
import runpy
import sys
from typing import List, Optional, Sequence

from . import __version__

PROG = "ort-torch-compat"
CHECKPOINT_FILE = "checkpoint"
TRAINING_MODEL_FILE = "training_model.onnx"
EVAL_MODEL_FILE = "eval_model.onnx"
# Without --training-model / --eval-model: the .onnx file, else ORT's converted .ort file.
_DEFAULT_MODEL_FILES = {
    "training": ("training_model.onnx", "training_model.ort"),
    "eval": ("eval_model.onnx", "eval_model.ort"),
}


def _model_file(directory: str, given: Optional[str], role: str) -> str:
    """The model file of `role` in `directory`: the one named, or the default .onnx, or the
    .ort file convert_onnx_models_to_ort writes when only that one is there."""
    if given:
        return os.path.join(directory, given)
    candidates = [os.path.join(directory, name) for name in _DEFAULT_MODEL_FILES[role]]
    return next((path for path in candidates if os.path.exists(path)), candidates[0])


_RUN_USAGE = f"usage: {PROG} run [-h] (SCRIPT | -m MODULE) [ARGS...]"
_RUN_HELP = f"""{_RUN_USAGE}

Run a Python script (or module) written for onnxruntime-training with
`import onnxruntime.training.api` resolved to ort_torch_compat.api.  The script gets its own
sys.argv, runs as __main__, and its exit status is the command's.
"""


# ---- run ------------------------------------------------------------------------------
def run(target: str, args: Sequence[str] = (), *, module: bool = False) -> None:
    """Run `target` (a path, or a module name with module=True) under the switch, as __main__."""
    from .switch import install

    install()
    if module:
        sys.argv = [target, *args]
        sys.path.insert(0, os.getcwd())  # as `python -m` does: packages in the current directory are found
        runpy.run_module(target, run_name="__main__", alter_sys=True)
        return
    if not os.path.exists(target):
        raise FileNotFoundError(f"can't open file '{target}': no such file")
    sys.argv = [target, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(target)))
    runpy.run_path(target, run_name="__main__")


def _module_exists(name: str) -> bool:
    """Whether `run -m NAME` would find a module (the current directory searched first, as `python -m`)."""
    import importlib.util

    sys.path.insert(0, os.getcwd())
    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):  # a parent package that does not exist, or an empty name
        return False
    finally:
        sys.path.pop(0)


def _run_command(argv: List[str]) -> int:
    if not argv:
        print(_RUN_USAGE, file=sys.stderr)
        print(f"{PROG} run: error: a SCRIPT or -m MODULE is required", file=sys.stderr)
        return 2
    if argv[0] in ("-h", "--help"):
        print(_RUN_HELP)
        return 0
    module = argv[0] == "-m"
    if module:
        if len(argv) < 2:
            print(_RUN_USAGE, file=sys.stderr)
            print(f"{PROG} run: error: -m needs a MODULE", file=sys.stderr)
            return 2
        target, rest = argv[1], argv[2:]
        if not _module_exists(target):
            print(
                f"{PROG} run: error: no module named '{target}' (looked in {os.getcwd()} and sys.path)", file=sys.stderr
            )
            return 1
    else:
        target, rest = argv[0], argv[1:]
        if not os.path.exists(target):
            print(f"{PROG} run: error: can't open file '{target}': no such file", file=sys.stderr)
            return 1
    run(target, rest, module=module)  # SystemExit and exceptions of the script propagate
    return 0


# ---- commands ---------------------------------------------------------------------------
def _progress():
    from .migrate.state_dict import progress_bar

    return progress_bar


def _inspect(args: argparse.Namespace) -> int:
    from .migrate.inspect import describe_checkpoint, format_description

    info = describe_checkpoint(args.checkpoint)
    print(json.dumps(info, indent=2) if args.json else format_description(info))
    return 0


def _to_torch(args: argparse.Namespace) -> int:
    from .migrate.state_dict import checkpoint_to_file

    tensors = checkpoint_to_file(args.checkpoint, args.out, include_optimizer=args.optimizer, progress=_progress())
    kind = (
        "safetensors"
        if str(args.out).endswith(".safetensors")
        else "a torch.save pickle; .safetensors holds no code, prefer it for files you share"
    )
    print(f"wrote {len(tensors)} tensors to {args.out} ({kind})")
    return 0


def _from_torch(args: argparse.Namespace) -> int:
    from .migrate.state_dict import file_to_checkpoint

    state = file_to_checkpoint(
        args.state,
        args.checkpoint,
        args.out,
        drop_optimizer=args.drop_optimizer,
        allow_pickle=args.allow_pickle,
        progress=_progress(),
    )
    optimizer = "with" if state.optimizer is not None else "without"
    print(f"wrote {args.out}: {len(state.parameters)} parameters, {optimizer} optimizer state")
    return 0


def _export(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    directory = args.artifacts_dir
    if not os.path.isdir(directory):
        raise NotADirectoryError(f"artifacts directory '{directory}' does not exist or is not a directory")
    paths = {
        "checkpoint": os.path.join(directory, args.checkpoint),
        "training": _model_file(directory, args.training_model, "training"),
        "eval": _model_file(directory, args.eval_model, "eval"),
    }
    for role, path in paths.items():
        if not os.path.exists(path):
            also = " (nor its .ort form)" if role != "checkpoint" and path.endswith(".onnx") else ""
            raise FileNotFoundError(f"{role} file '{path}' does not exist{also}")
    with tqdm(total=3, desc="export", leave=False, disable=not sys.stderr.isatty()) as bar:
        from .api import CheckpointState, Module

        state = CheckpointState.load_checkpoint(paths["checkpoint"])
        bar.update()
        module = Module(paths["training"], state, paths["eval"])
        bar.update()
        outputs = args.outputs
        if not outputs:
            from .engine.export import model_outputs

            eval_proto = _model_structure(paths["eval"])
            roots = [o.name for o in eval_proto.graph.output]
            outputs = model_outputs(eval_proto, roots, f"eval model {paths['eval']}")
        try:
            module.export_model_for_inferencing(args.out, outputs)
        except ValueError as error:  # an output the eval model does not compute
            raise ValueError(f"eval model '{paths['eval']}': {error}") from error
        bar.update()
    print(f"wrote {args.out} (outputs: {', '.join(outputs)})")
    return 0


def _model_structure(path: str):
    """The model at `path` without its external data (ONNX), or converted (ORT format)."""
    import onnx

    from .engine.model_io import load_model
    from .ortformat import is_ort_format

    with open(path, "rb") as handle:
        head = handle.read(8)
    if is_ort_format(head):
        return load_model(path, "eval model")
    return onnx.load(path, load_external_data=False)


def _input_shape(text: str):
    """NAME=SHAPE[:DTYPE], SHAPE as 2x8 or 2,8 (a scalar: NAME=)."""
    name, sep, rest = text.partition("=")
    shape_text, _, dtype = rest.partition(":")
    try:
        if not name or not sep:
            raise ValueError
        shape = tuple(int(d) for d in shape_text.replace("x", ",").split(",") if d.strip())
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected NAME=SHAPE[:DTYPE] such as input=2x8:float32, got {text!r}"
        ) from None
    return name, shape, dtype or None


def _compile(args: argparse.Namespace) -> int:
    from .engine.precompile import precompile

    directory = args.artifacts_dir
    if not os.path.isdir(directory):
        raise NotADirectoryError(f"artifacts directory '{directory}' does not exist or is not a directory")
    shapes = {name: shape for name, shape, _ in args.input}
    dtypes = {name: dtype for name, _, dtype in args.input if dtype}
    result = precompile(
        _model_file(directory, args.training_model, "training"),
        os.path.join(directory, args.checkpoint),
        shapes,
        dtypes,
    )
    if result.status == "compiled":
        print(f"compiled the train step in {result.seconds:.1f} s: {result.directory}")
    elif result.status == "cached":
        print(f"already compiled: {result.directory}")
    else:
        print(
            f"{PROG} compile: {result.status}: {result.reason} (train steps of these shapes run eagerly)",
            file=sys.stderr,
        )
        return 1
    return 0


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # usage errors: exit status 2, as argparse does
        self.print_usage(sys.stderr)
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog=PROG,
        description="Run onnxruntime-training scripts and artifacts on PyTorch; "
        "convert ORT checkpoints to and from PyTorch state dicts.",
    )
    parser.add_argument("--traceback", action="store_true", help="show the full traceback on errors")
    parser.add_argument("--version", action="version", version=f"{PROG} {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    commands.required = True

    commands.add_parser(
        "run", help="run an onnxruntime-training script unmodified (run SCRIPT [ARGS...])", add_help=False
    )

    p = commands.add_parser("inspect", help="show what a checkpoint holds")
    p.add_argument("checkpoint", help="ORT checkpoint file")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=_inspect, files=("checkpoint",))

    p = commands.add_parser("to-torch", help="checkpoint -> PyTorch state dict (.safetensors or .pt)")
    p.add_argument("checkpoint", help="ORT checkpoint file")
    p.add_argument("out", help="output file: .safetensors (recommended) or .pt")
    p.add_argument(
        "--optimizer",
        action="store_true",
        help="add the optimizer state (optimizer/<param>/<moment>, optimizer/step, optimizer/initial_learning_rate)",
    )
    p.set_defaults(func=_to_torch, files=("checkpoint", "out"))

    p = commands.add_parser("from-torch", help="PyTorch state dict + template checkpoint -> new checkpoint")
    p.add_argument("state", help="state dict file: .safetensors, or .pt with --allow-pickle")
    p.add_argument("checkpoint", help="template ORT checkpoint: trainable/frozen split, dtypes, properties, optimizer")
    p.add_argument("out", help="new ORT checkpoint file")
    p.add_argument("--drop-optimizer", action="store_true", help="write no optimizer state")
    p.add_argument(
        "--allow-pickle",
        action="store_true",
        help="allow reading a pickle-based .pt file (with torch.load(weights_only=True))",
    )
    p.set_defaults(func=_from_torch, files=("state", "checkpoint", "out"))

    p = commands.add_parser("export", help="inference model from artifacts and their checkpoint")
    p.add_argument("artifacts_dir", help="directory with the checkpoint and models (generate_artifacts' layout)")
    p.add_argument("out", help="output ONNX file")
    p.add_argument(
        "--outputs",
        nargs="+",
        metavar="NAME",
        help="graph outputs to keep (default: the model outputs the loss consumes)",
    )
    p.add_argument("--checkpoint", default=CHECKPOINT_FILE, help=f"checkpoint file name (default {CHECKPOINT_FILE})")
    p.add_argument("--eval-model", help=f"eval model file name (default {EVAL_MODEL_FILE}, else eval_model.ort)")
    p.add_argument(
        "--training-model", help=f"training model file name (default {TRAINING_MODEL_FILE}, else training_model.ort)"
    )
    p.set_defaults(func=_export, files=("artifacts_dir", "out"))

    p = commands.add_parser("compile", help="compile the train step ahead of time into the compile cache")
    p.add_argument("artifacts_dir", help="directory with the checkpoint and training model")
    p.add_argument(
        "--input",
        action="append",
        type=_input_shape,
        required=True,
        metavar="NAME=SHAPE[:DTYPE]",
        help="shape of a training-model input, e.g. input_ids=2x8 (repeat for each input; DTYPE "
        "where the model does not declare one)",
    )
    p.add_argument("--checkpoint", default=CHECKPOINT_FILE, help=f"checkpoint file name (default {CHECKPOINT_FILE})")
    p.add_argument(
        "--training-model", help=f"training model file name (default {TRAINING_MODEL_FILE}, else training_model.ort)"
    )
    p.set_defaults(func=_compile, files=("artifacts_dir",))
    return parser


def _one_line(error: BaseException, args: argparse.Namespace) -> str:
    message = " ".join(str(error).split()) or type(error).__name__
    files = [str(getattr(args, name)) for name in getattr(args, "files", ())]
    if not any(f in message for f in files) and files:
        message = f"{files[0]}: {message}"
    return message


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    traceback = False
    while argv and argv[0] == "--traceback":
        traceback, argv = True, argv[1:]
    if argv and argv[0] == "run":
        return _run_command(argv[1:])
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exit_:
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        return args.func(args)
    except KeyboardInterrupt:
        print(f"{PROG} {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as error:  # noqa: BLE001 - one line for users, --traceback for bug reports
        if traceback or args.traceback:
            raise
        print(f"{PROG} {args.command}: error: {_one_line(error, args)}", file=sys.stderr)
        return 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
