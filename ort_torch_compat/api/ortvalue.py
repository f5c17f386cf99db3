"""`ort_torch_compat.api.OrtValue`: the OrtValue every surface shares (defined in `values.py`)."""

from ..values import OrtValue

__all__ = ["OrtValue"]
