"""What a checkpoint holds, as plain data (`ort-torch-compat inspect`)."""

from __future__ import annotations

import os
from typing import Any, Dict, List

from ..codec import read_checkpoint
from ..codec.dtypes import dtype_name, element_size


def _nbytes(record) -> int:
    if record.raw_data:
        return len(record.raw_data)
    try:
        count = 1
        for d in record.dims:
            count *= int(d)
        return count * element_size(record.data_type)
    except ValueError:
        return 0


def describe_checkpoint(path: "str | os.PathLike[str]") -> Dict[str, Any]:
    """Parameters (name, dtype, shape, trainable, bytes), optimizer groups, properties, flags, sizes.

    Shapes of a nominal checkpoint are None: ORT stores only names and types there.
    """
    path = os.fspath(path)
    record = read_checkpoint(path)
    module = record.module_state
    nominal = bool(module and module.is_nominal)
    external = bool(module and module.has_external_data)
    parameters: List[Dict[str, Any]] = []
    if module is not None:
        for trainable, tensors in ((True, module.trainable), (False, module.frozen)):
            for t in tensors:
                parameters.append(
                    {
                        "name": t.name,
                        "dtype": dtype_name(t.data_type).lower(),
                        "shape": None if nominal else list(t.dims),
                        "trainable": trainable,
                        "bytes": 0 if nominal else _nbytes(t),
                    }
                )
    groups = []
    for group in record.optimizer_groups or []:
        moments = sorted({m.name for s in group.states for m in s.momentums})
        groups.append(
            {
                "name": group.group_name,
                "step": int(group.step),
                "initial_learning_rate": float(group.initial_learning_rate),
                "moments": moments,
                "parameters": [s.param_name for s in group.states],
                "bytes": sum(_nbytes(m) for s in group.states for m in s.momentums),
            }
        )
    data_file = path + ".data"
    sizes = {
        "file_bytes": os.path.getsize(path),
        "external_data_bytes": os.path.getsize(data_file) if external and os.path.exists(data_file) else 0,
        "parameter_bytes": sum(p["bytes"] for p in parameters),
        "trainable_bytes": sum(p["bytes"] for p in parameters if p["trainable"]),
        "optimizer_bytes": sum(g["bytes"] for g in groups),
        "parameters": len(parameters),
        "trainable_parameters": sum(1 for p in parameters if p["trainable"]),
    }
    return {
        "checkpoint": path,
        "format_version": int(record.version),
        "nominal": nominal,
        "external_data": external,
        "external_data_file": data_file if external else None,
        "parameters": parameters,
        "optimizer_groups": groups,
        "properties": dict(record.properties or {}),
        "sizes": sizes,
    }


def _human_bytes(n: int) -> str:
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"


def format_description(info: Dict[str, Any]) -> str:
    """The human-readable form of `describe_checkpoint`'s result."""
    sizes = info["sizes"]
    lines = [
        f"checkpoint {info['checkpoint']} (format v{info['format_version']}, {_human_bytes(sizes['file_bytes'])}"
        + (f" + {_human_bytes(sizes['external_data_bytes'])} external data" if info["external_data"] else "")
        + ")",
        f"nominal: {'yes' if info['nominal'] else 'no'}    external data: {'yes' if info['external_data'] else 'no'}",
        f"parameters: {sizes['parameters']} ({sizes['trainable_parameters']} trainable), "
        f"{_human_bytes(sizes['parameter_bytes'])} ({_human_bytes(sizes['trainable_bytes'])} trainable)",
    ]
    if info["parameters"]:
        width = max(len(p["name"]) for p in info["parameters"])
        lines.append(f"  {'name'.ljust(width)}  {'dtype':<9} {'shape':<16} trainable")
        for p in info["parameters"]:
            shape = "?" if p["shape"] is None else "x".join(map(str, p["shape"])) or "scalar"
            lines.append(f"  {p['name'].ljust(width)}  {p['dtype']:<9} {shape:<16} {'yes' if p['trainable'] else 'no'}")
    if info["optimizer_groups"]:
        for g in info["optimizer_groups"]:
            lines.append(
                f"optimizer group {g['name']}: step {g['step']}, initial lr {g['initial_learning_rate']:.6g}, "
                f"moments {', '.join(g['moments']) or 'none'} for {len(g['parameters'])} parameter(s), "
                f"{_human_bytes(g['bytes'])}"
            )
    else:
        lines.append("optimizer state: none")
    if info["properties"]:
        lines.append("properties:")
        for key in sorted(info["properties"]):
            lines.append(f"  {key} = {info['properties'][key]!r}")
    else:
        lines.append("properties: none")
    return "\n".join(lines)
