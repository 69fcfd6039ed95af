"""The trained model out of the Trainer: a `.keras` file and a SavedModel serving artifact.

Every worker of a multi-worker job calls these (writing may read distributed values,
which needs every worker, as Keras' multi-worker guide says); only the chief writes to
the path asked for, the other workers write to a private temporary directory and delete
it, as checkpoints do. A local `.keras` file is written beside the target and renamed
into place, so a crash never leaves a half-written model at the path.
"""

from __future__ import annotations

import os
import tempfile

import keras
import tensorflow as tf

from tfaccel.train.checkpoint import is_chief


def save(model: keras.Model, filepath, strategy: tf.distribute.Strategy) -> str:
    """Writes `model` (architecture and weights, not compiled) to `filepath` (`.keras`).

    Returns:
        `filepath` as a string.

    Raises:
        ValueError: a path not ending in `.keras`, a path that is a directory, or a
            model without weights yet.
    """
    path = os.fspath(filepath)
    if tf.io.gfile.isdir(path):
        raise ValueError(
            f"save: {path!r} is a directory; give a file path ending in .keras, e.g. "
            f"{os.path.join(path, 'model.keras')!r}."
        )
    if not path.endswith(".keras"):
        raise ValueError(
            f"save writes the Keras format: give a path ending in .keras (e.g. "
            f"'{os.path.splitext(path)[0] or 'model'}.keras'), got {path!r}. For a SavedModel "
            "to serve, use trainer.export(directory); for the weights alone, "
            "trainer.model.save_weights('model.weights.h5')."
        )
    _check_built(model, "save")
    if not is_chief(strategy):
        with tempfile.TemporaryDirectory(prefix="tfaccel-save-") as scratch:
            model.save(os.path.join(scratch, "model.keras"))
        return path
    folder = os.path.dirname(path)
    if folder:
        tf.io.gfile.makedirs(folder)
    if "://" in path:  # a remote file system: no rename into place
        model.save(path)
        return path
    partial = os.path.join(folder, f".{os.path.basename(path)[:-6]}.{os.getpid()}.partial.keras")
    try:
        model.save(partial)
        os.replace(partial, path)
    finally:
        if os.path.exists(partial):
            os.remove(partial)
    return path


def export(model: keras.Model, dirpath, strategy: tf.distribute.Strategy, **kwargs) -> str:
    """Writes `model.export(dirpath, **kwargs)` (a SavedModel with a `serve` endpoint).

    Returns:
        `dirpath` as a string.

    Raises:
        ValueError: `dirpath` is a file, or the model has no weights yet.
    """
    path = os.fspath(dirpath)
    if tf.io.gfile.exists(path) and not tf.io.gfile.isdir(path):
        raise ValueError(
            f"export writes a directory (a SavedModel), but {path!r} is a file. Give a "
            "directory path, e.g. 'exported/model'; for one file use trainer.save('model.keras')."
        )
    _check_built(model, "export")
    kwargs.setdefault("verbose", False)
    if "input_signature" not in kwargs and not isinstance(
        model, (keras.models.Sequential, keras.src.models.Functional)
    ):
        signature = _signature_from_inputs(model)  # e.g. a PipelineModel's first stage's
        if signature is not None:
            kwargs["input_signature"] = signature
    if not is_chief(strategy):
        with tempfile.TemporaryDirectory(prefix="tfaccel-export-") as scratch:
            model.export(os.path.join(scratch, "model"), **kwargs)
        return path
    model.export(path, **kwargs)
    return path


def _check_built(model: keras.Model, what: str) -> None:
    if not model.built or not model.weights:
        raise ValueError(
            f"{what}: the model has no weights yet (it is built on its first batch). Call "
            "trainer.fit(...) or trainer.evaluate(...) first, or build the model with "
            "model.build(input_shape)."
        )


def _signature_from_inputs(model: keras.Model) -> list | None:
    """`[spec]` from a subclassed model's `inputs` (Keras infers it only after a call)."""
    inputs = getattr(model, "inputs", None)
    if not inputs:
        return None
    specs = [tf.TensorSpec((None, *tuple(t.shape)[1:]), dtype=t.dtype, name=t.name) for t in inputs]
    return [specs[0] if len(specs) == 1 else specs]
