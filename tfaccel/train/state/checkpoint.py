"""Checkpoint and resume: what a checkpoint holds, how it is written, read and refused.

A checkpoint holds the global step, the epoch and the step within it, the model, the
optimizer (with its loss scale), the loss tracker's and metrics' running state, the
`tf.data` iterator (one device) and the run's shape (global batch, steps per epoch,
optimizer type, dataset fingerprint). Only the chief writes the real checkpoint;
other workers of a multi-worker job take part in the save (it may be a collective)
and write to a private temporary directory, which they delete afterwards.

Saves are asynchronous by default (`asynchronous=True`): `save` holds the step loop only
while every saved tensor is copied to host memory (`async_save.snapshot`, which also
serializes the input iterator's position); a background thread writes the files,
index last, and then publishes the checkpoint (state file rewritten, old ones
rotated). One save is in flight at a time: the next `save`, `restore`, `latest`,
`wait` and `close` wait for it. Multi-worker jobs save synchronously (background
writes on every worker, the non-chief workers' throw-away copies included, are not
tested).

Restore never treats a directory holding checkpoint files as empty: it tries the
newest checkpoint, then older ones, moving each unreadable one aside to
`<dir>/corrupt/` with a warning (only once a readable one is found); when none can
be read it raises `CheckpointCorruptError` and touches nothing.

Files deleted under a running job (a cleanup, another process) do not end it: a save whose
files vanish while it is written is written again (`deleted.py`), and the next save
says what went (the last checkpoint this run saved, the lock file, which it takes again)
and writes a fresh checkpoint, with a warning each.
"""

from __future__ import annotations

import builtins  # `set` in CheckpointState's body is its method
import os
import re
import warnings
from typing import Any

import tensorflow as tf

from tfaccel.errors import CheckpointCorruptError, CheckpointMismatchError
from tfaccel.train.state import async_save, deleted, hyperparameters, random_states
from tfaccel.train.state import checkpoint_files as files
from tfaccel.train.state.lock import DirectoryLock
from tfaccel.train.state.policies import RESUME_MODES, check_keep
from tfaccel.train.state.run_shape import ITERATOR_KEYS, POSITION_KEYS, RunShape, compare, holds

__all__ = ["ITERATOR_KEYS", "POSITION_KEYS", "CheckpointState", "RunShape", "is_chief"]


def is_chief(strategy: tf.distribute.Strategy) -> bool:
    """True unless this process is a non-chief worker of a multi-worker strategy."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not resolver.task_type:
        return True
    cluster = resolver.cluster_spec().as_dict()
    if "chief" in cluster:
        return resolver.task_type == "chief"
    return resolver.task_type == "worker" and resolver.task_id == 0


class CheckpointState:
    """Manages the checkpoints of one `fit` call.

    The directory is checked (a directory, writable by the chief) and cleared of what
    interrupted saves left when this object is created, i.e. before any training.

    Args:
        directory: where checkpoints live.
        strategy: the trainer's strategy (decides who writes for real).
        keep: how many checkpoints to keep.
        asynchronous: write files on a background thread (single-worker jobs only;
            synchronous where this TensorFlow lacks what `async_save` needs).
        **objects: trackables to save (model, optimizer, step, epoch, iterator...).

    Raises:
        ValueError: `keep` is not an integer >= 1, or `directory` is "".
        NotADirectoryError: `directory` is a file.
        PermissionError: the chief cannot write to `directory`.
        CheckpointLockedError: another live run holds `directory`.
    """

    def __init__(
        self,
        directory: str | os.PathLike[str],
        strategy: tf.distribute.Strategy,
        keep: int = 3,
        *,
        asynchronous: bool = True,
        **objects: Any,
    ) -> None:
        check_keep(keep)
        self.directory = os.fspath(directory)
        self.keep = keep
        self.chief = is_chief(strategy)
        files.check_directory(self.directory, writable=self.chief)
        self.objects = dict(objects)
        states = random_states.of(self.objects.get("model"))
        if states and "model_variables" not in self.objects:  # a model's own step saves all
            self.objects["random_states"] = states
        self.run_shape = RunShape()
        self.objects["run_shape"] = self.run_shape
        self.checkpoint = tf.train.Checkpoint(**self.objects)
        self.workers = workers = getattr(strategy.extended, "_num_workers", 1)
        self.asynchronous = asynchronous and workers == 1 and async_save.available(self.checkpoint)
        self.writer = async_save.Writer()
        self._write_dir = self.directory
        # The chief owns the directory until `close()` (see `lock.py`).
        self.lock = DirectoryLock(self.directory).acquire() if self.chief else None
        self.superseded: list[int] = []  # resume="never": the old run's checkpoints
        self.published: int | None = None  # the last checkpoint this run published
        self.written: set[int] = set()  # every checkpoint this run published
        self._said: list[str] = []  # warnings of the background write, said by `wait`
        if self.chief:
            try:
                files.remove_temporaries(self.directory)
            except BaseException:
                self.close()
                raise
        else:
            task_id = strategy.cluster_resolver.task_id
            self._write_dir = os.path.join(self.directory, f".worker{task_id}-tmp")
            if tf.io.gfile.exists(self._write_dir):
                tf.io.gfile.rmtree(self._write_dir)
        self.found = set(files.numbers(self.directory)) if self.chief else set()
        self.restored_path: str | None = None
        self.saved_shape: dict | None = None
        self.changed: dict = {}
        self.iterator_missing = False  # the restored checkpoint holds no input iterator
        self.new_metrics: list[str] = []

    def wait(self) -> None:
        """Waits until the save in flight is written and published (raises its OSError)."""
        try:
            self.writer.wait()
        finally:
            self._say()

    def _say(self) -> None:
        said, self._said = self._said, []
        for message in said:
            warnings.warn(message, stacklevel=4)

    def close(self) -> None:
        """Completes the save in flight, then releases the directory (removes the lock
        file); call when `fit` ends, however it ends. A failed save is warned about here,
        not raised, so it does not hide the exception that ended `fit`."""
        try:
            self.wait()
        except Exception as error:  # noqa: BLE001 - warned, see the docstring
            warnings.warn(f"The last checkpoint could not be saved: {error}", stacklevel=2)
        finally:
            if self.lock is not None:
                self.lock.release()

    def set(self, name: str, trackable: Any) -> None:
        """Replaces a saved object (e.g. a new input iterator)."""
        self.objects[name] = trackable
        setattr(self.checkpoint, name, trackable)

    # -- restore -------------------------------------------------------------------------

    def restore(self, run_shape: dict | None = None, resume: str = "auto") -> str | None:
        """Restores the newest readable checkpoint; returns its path, or None when there is none.

        Args:
            run_shape: this run's shape (global batch, steps per epoch, optimizer...),
                compared with the saved one and stored in later checkpoints.
            resume: "auto" refuses a changed global batch / steps per epoch / optimizer /
                training data (content fingerprint, see `tfaccel.data.fingerprint`);
                "force" accepts them (the optimizer then starts fresh when its type
                changed; when the batching did, the input iterator is not restored and
                the data is fast-forwarded past the examples already trained on);
                "never" restores nothing: the checkpoints present are deleted at this
                run's first save (with one warning now).

        Raises:
            CheckpointMismatchError: the checkpoint does not match this model/trainer,
                or the run shape changed and `resume` is not "force".
            CheckpointCorruptError: the directory holds checkpoint files but none can
                be read, or a state file that names checkpoints and no checkpoint files.
        """
        if resume not in RESUME_MODES:
            raise ValueError(f"resume must be one of {RESUME_MODES}, got {resume!r}.")
        self.wait()
        if run_shape is not None:
            self.run_shape.value = dict(run_shape)
        if resume == "never":
            self._supersede()
            return None
        failed = []
        for number in files.numbers(self.directory):
            path = files.prefix(self.directory, number)
            reason = files.unreadable(path)
            if reason is None:
                saved = RunShape.saved(path)
                self.changed = self._compare(saved, resume)
                skip = self._skipped_objects()
                # Saved where the iterator could not be (several replicas or workers): the
                # data is fast-forwarded instead (its order is the same, see global_order).
                self.iterator_missing = "iterator" in self.objects and not holds(path, "iterator")
                reason = self._read(
                    path, skip=skip | ({"iterator"} if self.iterator_missing else set())
                )
            if reason is not None:
                failed.append((number, reason))
                continue
            self.saved_shape = saved
            self._set_aside(failed, restored=path)
            self.restored_path = path
            return path
        if failed:
            listing = "\n".join(
                f"  {', '.join(files.files(self.directory, n))}: {why}" for n, why in failed
            )
            raise CheckpointCorruptError(
                f"{self.directory} holds {len(failed)} checkpoint(s) and none can be read:\n"
                f"{listing}\nNothing was changed or deleted. Restore the files from a backup, "
                "or move them away (or use a new checkpoint_dir) to start from scratch."
            )
        named = files.state_names(self.directory)
        if named:
            raise CheckpointCorruptError(
                f"The state file {os.path.join(self.directory, 'checkpoint')} names "
                f"{', '.join(named)}; no checkpoint files are left. Nothing was changed. "
                "Restore the files from a backup, or start from step 0 with "
                "fit(..., resume='never') or a new checkpoint_dir."
            )
        return None

    def _supersede(self) -> None:
        """resume="never": the checkpoints present are replaced (deleted at the first save)."""
        self.superseded = files.numbers(self.directory)
        named = files.state_names(self.directory)
        if self.superseded:
            old = ", ".join(f"{files.PREFIX}-{n}" for n in self.superseded)
            what = f"its checkpoints ({old}) are deleted at this run's first save"
        elif named:
            what = f"its state file (naming {', '.join(named)}) is rewritten at the first save"
        else:
            return
        warnings.warn(
            f"resume='never': starting from step 0 in {self.directory}; {what}.", stacklevel=4
        )

    def _compare(self, saved: dict | None, resume: str) -> dict:
        """Returns {entry: (saved, new)} for refused entries that changed (or raises)."""
        return compare(saved, self.run_shape.value, resume, self.directory)

    def _skipped_objects(self) -> builtins.set[str]:
        skip = set()
        if "optimizer" in self.changed:
            skip.add("optimizer")
        if any(key in self.changed for key in ITERATOR_KEYS):
            skip.add("iterator")
        return skip

    def _read(self, path: str, skip: builtins.set[str]) -> str | None:
        """Restores `path`; returns why a saved tensor could not be read (None when restored).

        Raises:
            CheckpointMismatchError: a true difference of names or shapes (named).
        """
        objects = {k: v for k, v in self.objects.items() if k not in skip}
        if "metrics" in objects:
            objects["metrics"], self.new_metrics = _saved_metrics(path, objects["metrics"])
        model = objects.get("model")
        # A compiled Keras model tracks its optimizer too: detach it while it is skipped.
        detached = getattr(model, "optimizer", None) if "optimizer" in skip else None
        status = None
        try:
            if detached is not None and model is not None:  # detached: it has a model
                del model.optimizer
            status = tf.train.Checkpoint(**objects).read(path)
            unmatched = _assert_matched(
                status, objects.get("optimizer"), random_states.paths(objects.get("random_states"))
            )
            if unmatched:
                warnings.warn(random_states.missing_note(unmatched), stacklevel=4)
        except tf.errors.OpError as error:
            if files.is_damage(error):
                text = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", str(error)).strip()
                return f"{type(error).__name__}: {text.splitlines()[0][:300]}"
            raise _mismatch(self.directory, path, error) from error
        except (AssertionError, ValueError, KeyError) as error:
            raise _mismatch(self.directory, path, error) from error
        finally:
            if status is not None:
                status.expect_partial()  # skipped objects are meant to stay unrestored
            if detached is not None and model is not None:
                model.optimizer = detached
        return None

    def _set_aside(self, failed: list, restored: str) -> None:
        """Moves unreadable checkpoints aside and repairs the state file (chief only)."""
        for number, reason in failed:
            where = "(left to the chief)"
            if self.chief:
                where = files.move_aside(self.directory, number)
            warnings.warn(
                f"Checkpoint {files.prefix(self.directory, number)} could not be read ({reason}); "
                f"moved its files to {where} and resumed from {os.path.basename(restored)}.",
                stacklevel=4,
            )
        if not self.chief:
            return
        present = files.numbers(self.directory)
        latest = files.state_latest(self.directory)
        if latest is None or os.path.basename(latest) != f"{files.PREFIX}-{max(present)}":
            # Naming an older checkpoint that is there: a save killed after its files were
            # complete and before it was published (rewritten here, nothing to warn about).
            behind = latest is not None and os.path.basename(latest) in {
                f"{files.PREFIX}-{n}" for n in present
            }
            if not failed and not behind:
                warnings.warn(
                    f"The state file of {self.directory} is missing, unreadable or stale "
                    f"(it names {latest}); rewrote it from the checkpoint files and resumed "
                    f"from {os.path.basename(restored)}.",
                    stacklevel=4,
                )
            files.write_state(self.directory, present[: self.keep][::-1])

    # -- save ----------------------------------------------------------------------------

    def save(self, step: int) -> str:
        """Saves checkpoint `step` (every worker must call it), then rotates old ones.

        The state file is rewritten only after the checkpoint is complete, and older
        checkpoints are deleted only after that, so a crash at any moment leaves the
        previous checkpoints loadable. Asynchronous: returns once the state is copied
        to host memory; the write's errors are raised by the next `save` or `wait`.

        Raises:
            NotADirectoryError: the directory was replaced by a file during training.
            OSError: it cannot be written any more (named, with TensorFlow's reason).
        """
        replaced = NotADirectoryError(
            f"Cannot save checkpoint {step}: checkpoint_dir {self._write_dir!r} is a "
            "file now (it was a directory when training started). Move that file "
            "away; the checkpoints saved so far were in that directory."
        )
        try:
            self.wait()  # one save in flight at a time
        except OSError as error:
            if os.path.isfile(self._write_dir):  # the write in flight failed for it
                raise replaced from error
            if "://" in self._write_dir or os.path.exists(self._write_dir):
                raise  # else: the directory was deleted mid-write; `_recreate` says so
        if os.path.exists(self._write_dir) and not os.path.isdir(self._write_dir):
            raise replaced
        if "://" not in self._write_dir and not os.path.exists(self._write_dir):
            self._recreate(step)
        deleted.check(self, step)
        if self.lock is not None:
            self.lock.refresh()  # CheckpointLockedError if another run took it over
        held = None
        if self.asynchronous:
            try:
                held = async_save.snapshot(self.checkpoint)
            except NotImplementedError:
                held = None  # e.g. a registered saver: this save is synchronous
        if held is None:
            try:
                return self._write(step, None)
            finally:
                self._say()
        self.writer.submit(lambda: self._write(step, held), f"checkpoint {step}")
        return files.prefix(self._write_dir, step)

    def _write(self, step: int, held: dict | None) -> str:
        """Writes checkpoint `step` (from a snapshot, or the live state), then publishes it;
        written again when its files are deleted under it (`deleted.WRITE_ATTEMPTS`)."""
        prefix = files.prefix(self._write_dir, step)
        # Several workers take part in a save: the chief never writes again alone.
        attempts = deleted.WRITE_ATTEMPTS if self.workers == 1 else 1
        lost = []
        while (why := self._write_files(step, held, prefix)) is not None:
            lost.append(why)
            if len(lost) == attempts:
                self._said.append(deleted.given_up(step, self._write_dir, why, attempts))
                return prefix
        if lost:
            self._said.append(deleted.rewritten(step, self._write_dir, lost[0]))
        if not self.chief:
            tf.io.gfile.rmtree(self._write_dir)
            return prefix
        old = set(self.superseded) - {step}
        present = [n for n in files.numbers(self.directory) if n not in old]
        kept = [n for n in present if n <= step][: self.keep]
        files.write_state(self.directory, kept[::-1])
        for number in present:
            if number < step and number not in kept:
                files.delete(self.directory, number)
        for number in sorted(old):
            files.delete(self.directory, number)
        self.superseded = []
        self.published = step
        self.written.add(step)
        return prefix

    def _write_files(self, step: int, held: dict | None, prefix: str) -> str | None:
        """Writes the files of checkpoint `step`; returns why they are not all there (they
        were deleted under the write, the directory still there), None when they are.

        Raises:
            OSError: the write failed otherwise (named, with TensorFlow's reason).
        """
        try:
            if held is None:
                self.checkpoint.write(prefix)
            else:
                async_save.write(held, prefix)
        except (tf.errors.OpError, OSError) as error:
            reason = (getattr(error, "message", None) or str(error)).strip().splitlines()[0]
            reason = re.sub(r"\{\{function_node [^}]*\}\}\s*", "", reason)
            if deleted.vanished(error) and os.path.isdir(self._write_dir):
                return f"{type(error).__name__}: {reason[:300]}"
            raise OSError(
                f"Cannot save checkpoint {step} in checkpoint_dir {self._write_dir!r}: "
                f"{reason}. Check that the directory still exists, is writable and has free "
                "space."
            ) from error
        if self.chief and not files.complete(self._write_dir, step):
            return "its files were gone right after they were written"
        return None

    def _recreate(self, step: int) -> None:
        """The directory was deleted while the run trained: made again, locked, said."""
        os.makedirs(self._write_dir, exist_ok=True)
        if self._write_dir != self.directory:
            return  # a worker's temporary directory
        self.published = None  # said here, with the directory
        warnings.warn(
            f"checkpoint_dir {self.directory!r} was deleted while this run trained (with the "
            f"checkpoints saved so far); made it again and saving step {step} there.",
            stacklevel=4,
        )
        if self.lock is not None:
            self.lock.retake()

    def will_restore(self, name: str, resume: str) -> bool:
        """Whether a restore now can give object `name` back: no checkpoint to resume, or the
        newest readable one holds it (an input iterator is not saved on several replicas)."""
        if resume == "never":
            return True
        for number in files.numbers(self.directory):
            path = files.prefix(self.directory, number)
            if files.unreadable(path) is None:
                return holds(path, name)
        return True

    @property
    def latest(self) -> str | None:
        """The newest checkpoint's path prefix, from the files (not the state file)."""
        self.wait()
        present = [n for n in files.numbers(self.directory) if n not in self.superseded]
        return files.prefix(self.directory, present[0]) if present else None


def _mismatch(directory: str, path: str, error: Exception) -> CheckpointMismatchError:
    details = " ".join(str(error).split())[:600]
    return CheckpointMismatchError(
        f"{directory} holds a checkpoint ({os.path.basename(path)}) of another model "
        f"or trainer: its variables' names or shapes differ from this one's ({details}). "
        "It cannot be resumed. Use a new checkpoint_dir, or delete the old one to start over."
    )


def _saved_metrics(path: str, metrics: dict) -> tuple[dict, list[str]]:
    """The metrics the checkpoint holds (restored) and the names of new ones (start at zero)."""
    keys = tf.train.load_checkpoint(path).get_variable_to_shape_map()
    saved = {key.split("/")[1] for key in keys if key.startswith("metrics/")}
    if not saved:  # a checkpoint without metrics' state: restore as before
        return metrics, []
    return {k: v for k, v in metrics.items() if k in saved}, [k for k in metrics if k not in saved]


def _assert_matched(status, optimizer, random: set[str]) -> set[str]:
    """Every object found its saved value, but the optimizer's hyperparameter variables and
    the model's random states (`random`: their paths); returns the random states left
    unrestored (a checkpoint saved before they were kept).

    The hyperparameters keep the user's values anyway (`hyperparameters.kept`), so a
    learning rate that is a variable now and was a schedule when saved is no mismatch.
    """
    try:
        status.assert_existing_objects_matched()
    except AssertionError as error:
        text = str(error)
        shown = re.search(r"Showing (\d+) of (\d+) unmatched", text)
        paths = set(re.findall(r"<Variable path=([^,>]+)", text))
        allowed = set(hyperparameters.variable_paths(optimizer)) if optimizer else set()
        if not (shown and shown[1] == shown[2] and paths and paths <= allowed | random):
            raise
        return paths & random
    return set()
