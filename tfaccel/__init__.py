"""tfaccel: fast Keras training on one GPU today and many machines tomorrow.

The public API lives here; names not exported from this module are private.
"""

import os as _os

_os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from tfaccel import data, devices, precision  # noqa: E402
from tfaccel.devices import DeviceConfigError  # noqa: E402

__version__ = "0.1.0"

__all__ = [
    "DeviceConfigError",
    "data",
    "devices",
    "precision",
]
