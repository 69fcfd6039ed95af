"""The Trainer's progress bar: Keras' own, without the bookkeeping keys."""

from __future__ import annotations

from typing import Any

import keras

# Values in the batch logs that callbacks need but that are not metrics to show.
BOOKKEEPING_KEYS = frozenset({"steps", "input_wait_s"})


class ProgressBar(keras.callbacks.ProgbarLogger):
    """`keras.callbacks.ProgbarLogger` that does not display `BOOKKEEPING_KEYS`."""

    def _update_progbar(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        super()._update_progbar(batch, _shown(logs))

    def _finalize_progbar(self, logs: dict[str, Any] | None) -> None:
        super()._finalize_progbar(_shown(logs))


def _shown(logs: dict[str, Any] | None) -> dict[str, Any]:
    return {k: v for k, v in (logs or {}).items() if k not in BOOKKEEPING_KEYS}
