"""The trained model out of the Trainer: a `.keras` file and a SavedModel serving artifact.

Every worker of a multi-worker job calls these (writing may read distributed values,
which needs every worker, as Keras' multi-worker guide says); only the chief writes to
the path asked for, the other workers write to a private temporary directory and delete
it, as checkpoints do. A local `.keras` file is written in a private temporary folder
(unpredictable name, mode 0700) beside the target and renamed into place, so a crash
never leaves a half-written model at the path and no planted link is followed. A write
that fails (read-only, below a file, disk full) raises the same `OSError` class with the
path, the errno in words, and what is left at the path.
"""

from __future__ import annotations

import errno
import os
import shutil
import tempfile
from typing import Any

import keras
import tensorflow as tf

from tfaccel.train.state.checkpoint import is_chief


def save(
    model: keras.Model, filepath: str | os.PathLike[str], strategy: tf.distribute.Strategy
) -> str:
    """Writes `model` (architecture and weights, not compiled) to `filepath` (`.keras`).

    Returns:
        `filepath` as a string.

    Raises:
        ValueError: a path not ending in `.keras`, a path that is a directory, or a
            model without weights yet.
        OSError: the file cannot be written (its class and errno kept; the message says
            the path, the errno in words, and that an old file there is intact).
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
    if "://" in path:  # a remote file system: no rename into place
        tf.io.gfile.makedirs(os.path.dirname(path))
        model.save(path)
        return path
    existed = os.path.exists(path)
    try:
        folder = _make_folder(path)
        scratch = tempfile.mkdtemp(prefix=f".{os.path.basename(path)}.", dir=folder)
    except OSError as error:
        raise _write_error("save", path, error, existed) from None
    try:  # a private 0700 folder: nobody can plant a link at the file keras writes
        partial = os.path.join(scratch, "model.keras")
        model.save(partial)
        os.replace(partial, path)
    except OSError as error:
        raise _write_error("save", path, error, existed) from None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return path


def _make_folder(path: str) -> str:
    folder = os.path.dirname(os.path.abspath(path))
    above = folder
    while not os.path.lexists(above) and os.path.dirname(above) != above:
        above = os.path.dirname(above)
    if os.path.lexists(above) and not os.path.isdir(above):  # below a regular file
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), above)
    os.makedirs(folder, exist_ok=True)
    return folder


def _write_error(what: str, path: str, error: OSError, existed: bool) -> OSError:
    """`error` again (same class and errno) saying the path, the errno in words, what is left."""
    code = errno.errorcode.get(error.errno or 0, str(error.errno))  # no name has 0
    where = f" ({error.filename})" if error.filename and error.filename != path else ""
    left = (
        f"the old {'file' if what == 'save' else 'export'} at {path!r} is intact"
        if existed
        else "nothing was written there"
    )
    if what == "export" and existed:
        left = f"files at {path!r} may be partly overwritten"
    text = (
        f"{what}: cannot write {path!r}: {os.strerror(error.errno or 0)} [{code}]{where}; "
        f"{left}. Free space, or choose a writable path (a directory, not below a file)."
    )
    return type(error)(error.errno, text)


def export(
    model: keras.Model,
    dirpath: str | os.PathLike[str],
    strategy: tf.distribute.Strategy,
    **kwargs: Any,
) -> str:
    """Writes `model.export(dirpath, **kwargs)` (a SavedModel with a `serve` endpoint).

    Returns:
        `dirpath` as a string.

    Raises:
        ValueError: `dirpath` is a file, or the model has no weights yet.
        OSError: the directory cannot be written (path and errno in words).
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
    if "://" in path:
        model.export(path, **kwargs)
        return path
    existed = os.path.exists(path)
    try:
        folder = _make_folder(os.path.join(path, "x"))  # the export directory itself
        with tempfile.TemporaryFile(dir=folder):
            pass
        model.export(path, **kwargs)
    except OSError as error:
        raise _write_error("export", path, error, existed) from None
    except tf.errors.OpError as error:  # TensorFlow's writers do not raise OSError
        raise OSError(errno.EIO, f"export: cannot write {path!r}: {error.message}") from None
    return path


def _check_built(model: keras.Model, what: str) -> None:
    if not model.built or not model.weights:
        raise ValueError(
            f"{what}: the model has no weights yet (it is built on its first batch). Call "
            "trainer.fit(...) or trainer.evaluate(...) first, or build the model with "
            "model.build(input_shape)."
        )


def _signature_from_inputs(model: keras.Model) -> list[Any] | None:
    """`[spec]` from a subclassed model's `inputs` (Keras infers it only after a call)."""
    inputs = getattr(model, "inputs", None)
    if not inputs:
        return None
    specs = [tf.TensorSpec((None, *tuple(t.shape)[1:]), dtype=t.dtype, name=t.name) for t in inputs]
    return [specs[0] if len(specs) == 1 else specs]
