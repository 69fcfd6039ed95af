"""Old import paths of the measured choices, kept working for a while.

The choices lived in five places before `tfaccel.choices` (`tfaccel.precision_probe`,
`tfaccel.train.step.precision_step`, `tfaccel.train.step.passes`,
`tfaccel.train.setup.xla_choice`, `tfaccel.train.loop.loop_size`,
`tfaccel.train.loop.agreement`). Each old module is now two lines that hand every name on
to its new home and warn once, on import, with a `DeprecationWarning` naming it.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Callable
from typing import Any


def forward(old: str, *new: str) -> Callable[[str], Any]:
    """Warns that `old` moved to `new` (its names now in these modules, the first named in
    the warning); returns the module `__getattr__` that reads them there."""
    warnings.warn(
        f"{old} moved to {' and '.join(new)}; import it from there ({old} will be removed).",
        DeprecationWarning,
        stacklevel=3,
    )
    modules = [importlib.import_module(name) for name in new]

    def __getattr__(name: str) -> Any:
        for module in modules:
            if hasattr(module, name):
                return getattr(module, name)
        raise AttributeError(f"{old} has no {name!r} (it moved to {', '.join(new)})")

    return __getattr__
