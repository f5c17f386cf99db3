"""The import path ``ort_torch_compat.session`` as documented before the C-API session moved to `capi_session.py`; kept so user code keeps working.

The C-API-shaped session lives in `ort_torch_compat.capi_session` (also exported at the
package top level: ``ort_torch_compat.TrainingSession``); this module re-exports it.
"""

from __future__ import annotations

from .capi_session import TrainingSession, load_checkpoint, load_checkpoint_from_buffer, save_checkpoint, set_seed

__all__ = ["TrainingSession", "load_checkpoint", "load_checkpoint_from_buffer", "save_checkpoint", "set_seed"]
