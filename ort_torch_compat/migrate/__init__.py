"""Leaving onnxruntime-training: state conversion and native torch modules.

* `state_to_tensors` / `checkpoint_to_file`: an ORT checkpoint as a flat state dict
  (`.pt` or `.safetensors`), optimizer moments optional (`ort-torch-compat to-torch`).
* `tensors_to_state` / `state_dict_to_checkpoint` / `file_to_checkpoint`: back to an ORT
  checkpoint with a template checkpoint's structure (`ort-torch-compat from-torch`).
* `describe_checkpoint`: what a checkpoint holds (`ort-torch-compat inspect`).
* `to_torch_module`: the artifacts as a plain `torch.nn.Module`.

Names are imported on first use, so `ort-torch-compat inspect` does not import torch.
"""

import importlib

_EXPORTS = {
    "describe_checkpoint": "inspect",
    "format_description": "inspect",
    "MigrationError": "state_dict",
    "OPTIMIZER_PREFIX": "state_dict",
    "STEP_KEY": "state_dict",
    "INITIAL_LR_KEY": "state_dict",
    "state_to_tensors": "state_dict",
    "tensors_to_state": "state_dict",
    "checkpoint_to_file": "state_dict",
    "state_dict_to_checkpoint": "state_dict",
    "file_to_checkpoint": "state_dict",
    "load_tensor_file": "state_dict",
    "save_tensor_file": "state_dict",
    "to_torch_module": "torch_module",
    "OrtTorchModule": "torch_module",
    "model_outputs": "torch_module",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{module}"), name)


def __dir__():
    return sorted(list(globals()) + list(_EXPORTS))
