"""Asynchronous checkpoint writes: the step loop waits only for a copy in host memory.

`snapshot(checkpoint)` asks every saved object for its tensors, exactly as
`tf.train.Checkpoint.write` does, and reads them now (variables copied to host memory,
the `tf.data` iterator's state serialized); `write(snapshot, prefix)` later writes
those tensors in TensorFlow's checkpoint format (shards in `<prefix>_temp/`, then the
data file and, last, the index), so `tf.train.Checkpoint.read` restores them as
any other checkpoint. `Writer` runs one such write at a time on a background thread.

Why not `tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)`:
measured with TensorFlow 2.21 and Keras 3, its second save fails (the Keras variable's
host copy is a new `tf.Variable` made inside a `tf.function`: "tf.function only
supports singleton tf.Variables"), its own `Checkpoint` keeps the objects of its
first save (a new input iterator would not be saved) and it tells no one when a write
is complete, which the publication (state file, rotation) needs.

This uses two TensorFlow internals (`TrackableSaver._gather_serialized_tensors`,
`functional_saver.MultiDeviceSaver`); `available()` says whether they are there, and
the checkpoints fall back to synchronous writes when not.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

import tensorflow as tf

try:  # TensorFlow internals; see `available`
    from tensorflow.python.checkpoint import functional_saver
    from tensorflow.python.training.saving import saveable_object
except ImportError:  # pragma: no cover - another TensorFlow layout
    functional_saver = saveable_object = None


def available(checkpoint: tf.train.Checkpoint) -> bool:
    """Whether this TensorFlow lets a checkpoint be snapshot and written later."""
    saver = getattr(checkpoint, "_saver", None)
    return functional_saver is not None and hasattr(saver, "_gather_serialized_tensors")


def snapshot(checkpoint: tf.train.Checkpoint) -> dict:
    """Every tensor `checkpoint.write` would save, read now and held in host memory.

    Returns a value for `write`. Objects saved through registered savers (e.g. TPU
    embeddings) are not supported: `NotImplementedError`.
    """
    serialized, _, registered, _ = checkpoint._saver._gather_serialized_tensors(None)
    if registered:
        raise NotImplementedError("objects with registered savers need a synchronous save")
    with tf.device("/cpu:0"):
        for obj, tensors in list(serialized.items()):  # keyed by identity: updated in place
            serialized[obj] = {key: _held(value) for key, value in tensors.items()}
    return serialized


def _held(value):
    """A tensor, SaveSpec or {slice: ...} with every tensor read now into host memory."""
    if isinstance(value, dict):
        return {spec: _held(part) for spec, part in value.items()}
    if isinstance(value, saveable_object.SaveSpec):
        tensor = value.tensor  # a variable's read: a Callable is evaluated here
        if tensor is None:
            return value  # an uninitialized variable; TensorFlow decides what to do
        return saveable_object.SaveSpec(
            tf.identity(tensor), value.slice_spec, value.name, value.dtype, value.device
        )
    return tf.identity(value)


def write(held: dict, prefix: str) -> str:
    """Writes a `snapshot` as the checkpoint `prefix` (index last); returns `prefix`."""
    tf.io.gfile.makedirs(os.path.dirname(prefix) or ".")
    with tf.device("/cpu:0"):
        functional_saver.MultiDeviceSaver(held).save(tf.constant(prefix))
    return prefix


WRITER_NICE = 10  # the write thread's niceness over the training threads' (Linux)


def _yield_to_training() -> None:
    """Lowers the calling thread's CPU priority (on Linux a thread has its own nice
    value), so that on a busy host the write takes the cores the steps leave idle."""
    try:
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, os.getpriority(os.PRIO_PROCESS, tid) + WRITER_NICE)
    except (AttributeError, OSError):  # not Linux, or not allowed: the default priority
        pass


class Writer:
    """Runs one write at a time on a background thread; errors come back on `wait`."""

    def __init__(self) -> None:
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None
        self.what: str | None = None  # what is being written, while it is

    @property
    def busy(self) -> bool:
        """Whether a write is in flight."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, job: Callable[[], object], what: str) -> None:
        """Waits for the write in flight (raising its error), then starts `job`."""
        self.wait()
        self.what = what

        def run():
            _yield_to_training()
            try:
                job()
            except BaseException as error:  # noqa: BLE001 - handed to the caller on wait()
                self._error = error

        # Not a daemon: an interpreter that exits normally still completes the write.
        self._thread = threading.Thread(target=run, name=f"tfaccel-save {what}", daemon=False)
        self._thread.start()

    def wait(self) -> None:
        """Blocks until the write in flight is complete; re-raises the error it hit."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        error, self._error = self._error, None
        if error is not None:
            raise error
