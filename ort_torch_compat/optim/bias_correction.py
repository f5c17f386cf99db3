"""The bias-correction coefficient of ORT's legacy Adam and Lamb kernels."""
from __future__ import annotations

import math

import numpy as np


def bias_correction(coefficient: float, step: int) -> float:
    """1 - coefficient**step as ORT's `compute_bias_correction_coefficient` computes it.

    The power is taken in float64 from the float32 coefficient and the result rounded to
    float32; a step <= 0 gives 1 (no correction), which is why a legacy step count of 0
    cannot divide by zero.
    """
    if step <= 0:
        return 1.0
    return float(np.float32(1.0 - math.pow(float(np.float32(coefficient)), float(step))))
