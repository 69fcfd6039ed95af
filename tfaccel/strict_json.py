"""Strict JSON for every file and line the project writes: no `NaN` / `Infinity` tokens.

Python's `json` writes `NaN` and `Infinity`, which are not JSON (most parsers reject
them). `dumps` maps non-finite floats to `null` and NumPy scalars and arrays to Python
values, then writes with `allow_nan=False`.
"""

from __future__ import annotations

import json
import math
from typing import Any

import numpy as np


def finite(value: Any) -> Any:
    """`value` with non-finite floats as None, NumPy values as Python ones (recursively)."""
    if isinstance(value, (np.generic, np.ndarray)):
        value = value.tolist()
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {key: finite(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(item) for item in value]
    return value


def dumps(value: Any, **kwargs: Any) -> str:
    """`json.dumps` of `finite(value)` with `allow_nan=False` (other keywords pass through)."""
    return json.dumps(finite(value), allow_nan=False, **kwargs)
