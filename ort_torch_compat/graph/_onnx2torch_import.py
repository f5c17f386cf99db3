"""Import onnx2torch without importing torchvision.

onnx2torch imports torchvision at import time for two converters (NonMaxSuppression and
RoiAlign) that training graphs never contain; that import costs ~0.9 s and ~160 MB of
resident memory, which is the difference between a setup and peak memory on par with
ONNX Runtime and one that is not.  While onnx2torch loads, `torchvision` and
`torchvision.ops` are placeholders whose three functions import the real torchvision on
first call; the placeholders are removed from `sys.modules` right after, so any other
`import torchvision` gets the real package.
"""

from __future__ import annotations

import importlib
import sys
import types

_FORWARDED = ("nms", "box_convert", "roi_align")


def _forward(attribute: str):
    def call(*args, **kwargs):
        return getattr(importlib.import_module("torchvision.ops"), attribute)(*args, **kwargs)

    call.__name__ = attribute
    return call


def import_onnx2torch() -> None:
    if "onnx2torch" in sys.modules or "torchvision" in sys.modules:
        importlib.import_module("onnx2torch")
        return
    vision = types.ModuleType("torchvision")
    ops = types.ModuleType("torchvision.ops")
    for attribute in _FORWARDED:
        setattr(ops, attribute, _forward(attribute))
    vision.ops = ops
    sys.modules["torchvision"], sys.modules["torchvision.ops"] = vision, ops
    try:
        importlib.import_module("onnx2torch")
    finally:
        for name, placeholder in (("torchvision", vision), ("torchvision.ops", ops)):
            if sys.modules.get(name) is placeholder:
                del sys.modules[name]


import_onnx2torch()
