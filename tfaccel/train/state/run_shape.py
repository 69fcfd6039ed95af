"""The run's shape in a checkpoint: what a resumed run must share with the saved one.

The shape (global batch, steps per epoch, optimizer, data fingerprint, input pipelines
and their order...) is one JSON string in the checkpoint; `compare` refuses a resume
whose shape changed, unless `resume="force"`. A changed number of input pipelines
(workers) is refused only where the batches depend on it (`tfaccel.data.order.global_order`).
"""

from __future__ import annotations

import json
import warnings

import tensorflow as tf

from tfaccel import strict_json
from tfaccel.errors import CheckpointMismatchError

__all__ = ["ITERATOR_KEYS", "POSITION_KEYS", "REFUSED", "RunShape", "compare", "holds"]

# Run-shape entries a resumed run must share (unless resume="force"), with how to name them.
REFUSED = {
    "global_batch": "global batch",
    "input_pipelines": "number of input pipelines (workers)",
    "steps_per_epoch": "steps per epoch",
    "optimizer": "optimizer type",
    "accumulate_steps": "gradient accumulation (accumulate_steps)",
    "data": "training data",
}
# Entries whose change moves the data position: the saved iterator is not restored.
POSITION_KEYS = ("global_batch", "steps_per_epoch", "accumulate_steps")
# ...and those whose change makes the saved iterator's data other data (same position).
ITERATOR_KEYS = (*POSITION_KEYS, "data")


def holds(path: str, name: str) -> bool:
    """Whether checkpoint `path` holds an object saved as `name`."""
    return any(key.startswith(f"{name}/") for key, _ in tf.train.list_variables(path))


def _pipelines_changed(saved: dict, new: dict) -> dict:
    """{"input_pipelines": (saved, new)} when the worker count changed and either run's
    order is not global (its batches depend on the count: a resume would replay or skip
    examples); {} otherwise (checkpoints without the entries included)."""
    before, after = saved.get("input_pipelines"), new.get("input_pipelines")
    if before is None or after is None or before == after:
        return {}
    orders = saved.get("input_order"), new.get("input_order")
    if all(order == "global" for order in orders):
        return {}
    return {"input_pipelines": (before, after)}


def _pipelines_text(saved: dict, new: dict) -> str:
    why = next(o for o in (new.get("input_order"), saved.get("input_order")) if o != "global")
    return (
        f"the input was read by {saved['input_pipelines']} input pipeline(s) (workers), now "
        f"{new['input_pipelines']}, and its batches depend on that count ({why}), so the "
        "interrupted epoch would replay or skip examples. Resume on "
        f"{saved['input_pipelines']} worker(s), or read rows in memory (from_arrays) through "
        "tfaccel.data.pipeline with a seed and no file cache: its global order resumes "
        "exactly on any worker count"
    )


class RunShape(tf.__internal__.tracking.Trackable):
    """The run's shape as one JSON string tensor in the checkpoint (read back by key)."""

    KEY = "run_shape/.ATTRIBUTES/json"

    def __init__(self, value: dict | None = None):
        self.value = dict(value or {})

    def _serialize_to_tensors(self):
        with tf.device("/cpu:0"):
            return {"json": tf.constant(strict_json.dumps(self.value, sort_keys=True))}

    def _restore_from_tensors(self, restored_tensors):
        return tf.no_op()  # read with `saved_run_shape`; the running values win

    @staticmethod
    def saved(path: str) -> dict | None:
        """The run shape stored in checkpoint `path`, or None for older checkpoints."""
        reader = tf.train.load_checkpoint(path)
        if not reader.has_tensor(RunShape.KEY):
            return None
        return json.loads(reader.get_tensor(RunShape.KEY))


def compare(saved: dict | None, new: dict, resume: str, directory: str) -> dict:
    """Returns {entry: (saved, new)} for refused entries that changed between the saved run
    shape and `new` (or raises `CheckpointMismatchError` unless `resume` is "force")."""
    if saved is None:
        return {}
    changed = {
        key: (saved.get(key), new.get(key))
        for key in REFUSED
        if key in saved and key in new and saved[key] != new[key] and key != "input_pipelines"
    }
    changed.update(_pipelines_changed(saved, new))
    if changed and resume != "force":
        what = "; ".join(
            f"the training data changed (fingerprint saved {a}, now {b})"
            if k == "data"
            else _pipelines_text(saved, new)
            if k == "input_pipelines"
            else f"{REFUSED[k]}: saved {a!r}, now {b!r}"
            for k, (a, b) in changed.items()
        )
        raise CheckpointMismatchError(
            f"{directory} holds a checkpoint of a run with a different shape or data "
            f"({what}). Resuming would silently train with other settings or data than "
            "the ones saved. Use the saved settings and data, a new checkpoint_dir, or "
            "fit(..., resume='force') to continue from the checkpoint with the new ones."
        )
    if saved.get("dataset") and new.get("dataset") and saved["dataset"] != new["dataset"]:
        warnings.warn(
            f"The training data differs from the checkpoint's (saved {saved['dataset']}, "
            f"now {new['dataset']}); resuming anyway.",
            stacklevel=5,
        )
    for key, (old, now) in changed.items():
        warnings.warn(
            f"resume='force': the {REFUSED[key]} changed from {old!r} to {now!r}"
            + (
                "; the optimizer starts fresh (its slots are not restored)."
                if key == "optimizer"
                else "; the batches depend on that count: this epoch continues from the saved "
                "step on the new shards, so some of its examples repeat and others are skipped."
                if key == "input_pipelines"
                else "; the saved input position is not restored: training continues from "
                "the saved step on the new data, past as many batches as were trained on."
                if key == "data"
                else "; the data continues after the examples already trained on and the "
                "interrupted epoch counts its steps from 0."
            ),
            stacklevel=5,
        )
    return changed
