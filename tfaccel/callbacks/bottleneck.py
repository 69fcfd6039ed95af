"""Bottleneck: each epoch's shares of wall time — input, steps, host — and a verdict."""

from __future__ import annotations

import os
import time
import warnings
from typing import Any

import keras

from tfaccel.callbacks import _fit_wait
from tfaccel.callbacks._steps import share, user_stacklevel, wait_for

VERDICTS = ("input", "host", "compute")
HINTS = {
    "input": "the steps wait for batches: tfaccel.data.explain(dataset) names what the "
    "pipeline lacks (parallel reading, parallel map, prefetch, cache)",
    "host": "time goes between calls (Python, callbacks, checkpoints): run more steps per "
    "call (steps_per_execution / steps_per_loop) or lighten the callbacks",
    "compute": "the steps themselves: tfaccel.doctor.diagnose(...) says whether a larger "
    "batch, mixed precision or XLA would help",
}
KEYS = ("input", "step", "host")


def verdict(shares: dict, input_threshold: float, host_threshold: float) -> str:
    """The one-word verdict from an epoch's shares (`shares["input"]` may be None)."""
    over = [
        (shares[name], name)
        for name, threshold in (("input", input_threshold), ("host", host_threshold))
        if shares[name] is not None and shares[name] >= threshold
    ]
    return max(over)[1] if over else "compute"


class Bottleneck(keras.callbacks.Callback):
    """Where each epoch's training time goes, and a one-word verdict of the limit.

    The epoch's wall time, from its first batch call to its last (validation and
    epoch-end work excluded), is split into three shares that add up to 1:

    - **input** (`bottleneck_input_share`): steps blocked waiting for their batch;
    - **step** (`bottleneck_step_share`): the rest of the calls (the steps running);
    - **host** (`bottleneck_host_share`): between calls — Python, other callbacks'
      batch hooks, checkpoints.

    Verdict: **"input"** when the input share is at least `input_threshold` (default
    0.2), **"host"** when the host share is at least `host_threshold` (default 0.2),
    the larger of the two when both are; else **"compute"**. A share of 0.2 means that
    removing that part would make the epoch up to 1.25× faster. The shares go into the
    `on_epoch_end` logs (so Keras's `TensorBoard`/`CSVLogger` record them; put this
    callback first, see `ordered`); the verdict words (strings in the logs break Keras's
    progress bar and TensorBoard) are kept in `verdicts`, in `epochs`, printed each
    epoch when `verbose`, and written to TensorBoard as text next to the scalars
    `bottleneck/{input,step,host}_share` when `log_dir` is given.

    Where the input wait comes from:

    - `tfaccel.Trainer`: `logs["input_wait_s"]`, timed inside the step loop's graph.
    - `model.fit` (TensorFlow backend) with `steps_per_execution=1`: the callback wraps
      the model's train function for the run so that it pulls each batch with a timed
      `next()` on Keras's own iterator and runs the same compiled step on it (one eager
      fetch per step instead of one in the graph); the original is put back at the end.
    - `model.fit` with `steps_per_execution > 1`: the batches are read inside one graph
      call of many steps, out of Python's sight; the input share is not logged and
      waiting for input counts as step time (said once). Use steps_per_execution=1 for
      the diagnosis, or the Trainer.

    What it cannot see: how long the input pipeline takes when it keeps up (prefetch
    hides it: then it is not the limit), the time inside a step (device kernels —
    `ProfileSteps`), and work a step waits on in other processes (all-reduce with other
    workers counts as step time; `tfaccel.doctor.diagnose` measures it). The first
    batch call of training (tracing and compilation) is left out of its epoch's shares
    unless it is the epoch's only call.

    Args:
        input_threshold: input share from which the verdict is "input" (0 < t < 1).
        host_threshold: host share from which the verdict is "host" (0 < t < 1).
        log_dir: also write the shares and the verdict there as TensorBoard summaries
            (step = epoch); None: logs only. In a multi-worker job give each worker its
            own folder, or pass it on the chief only.
        verbose: print one line per epoch with the shares, the verdict and the hint.

    Raises:
        ValueError: a threshold outside (0, 1), or a `log_dir` that is not a string/path.
    """

    loop_batches_ok = True  # its batch hooks count a loop's steps: no n = 1 needed

    def __init__(
        self,
        input_threshold: float = 0.2,
        host_threshold: float = 0.2,
        log_dir: str | os.PathLike | None = None,
        verbose: int = 1,
    ) -> None:
        super().__init__()
        self.input_threshold = share("input_threshold", input_threshold)
        self.host_threshold = share("host_threshold", host_threshold)
        if log_dir is not None and not isinstance(log_dir, (str, os.PathLike)):
            raise ValueError(
                f"log_dir must be a folder path (str or os.PathLike) or None, got {log_dir!r}."
            )
        self.log_dir = None if log_dir is None else os.fspath(log_dir)
        self.verbose = verbose
        self.verdicts: list[str] = []
        self.epochs: list[dict] = []
        self.expect_call = False  # set for the model.fit wrapper (see _fit_wait)
        self.fit_wait: float | None = None

    # -- hooks ---------------------------------------------------------------------------

    def on_train_begin(self, logs: dict | None = None) -> None:
        self.verdicts, self.epochs = [], []
        self._calls = 0
        self._writer: Any = None  # a tf.summary file writer, made at the first summary
        self._said_blind = False
        self._wrapped = self.model is not None and _fit_wait.install(self.model, self)
        self.on_epoch_begin(None)  # trainers that never call on_epoch_begin

    def on_epoch_begin(self, epoch: int | None, logs: dict | None = None) -> None:
        self._inside = self._wait = self._gap = 0.0
        self._counted = self._unknown = 0
        self._first: tuple[float, float | None] | None = None  # the first call, if this epoch
        self._last_end: float | None = None
        self._began: float | None = None

    def on_train_batch_begin(self, batch: int, logs: dict | None = None) -> None:
        now = self._began = time.perf_counter()
        if self._last_end is not None:
            self._gap += now - self._last_end
        self.fit_wait = None
        self.expect_call = self._wrapped

    def on_train_batch_end(self, batch: int, logs: dict | None = None) -> None:
        wait_for(logs)
        now = time.perf_counter()
        self.expect_call = False
        if self._began is None:
            return
        inside = now - self._began
        wait = (logs or {}).get("input_wait_s", self.fit_wait)
        wait = None if wait is None else min(max(float(wait), 0.0), inside)
        self._last_end = now
        self._calls += 1
        if self._calls == 1:
            self._first = (inside, wait)  # tracing: counted only if the epoch has no other
            return
        self._count(inside, wait)

    def _count(self, inside: float, wait: float | None) -> None:
        self._inside += inside
        self._counted += 1
        if wait is None:
            self._unknown += 1
        else:
            self._wait += wait

    def on_epoch_end(self, epoch: int | None, logs: dict | None = None) -> None:
        warmup = False
        if self._counted == 0 and self._first is not None:
            self._count(*self._first)
            self._gap, warmup = 0.0, True
        total = self._inside + self._gap
        if self._counted == 0 or total <= 0:
            return
        known = self._unknown < self._counted
        shares = {
            "input": self._wait / total if known else None,
            "step": (self._inside - (self._wait if known else 0.0)) / total,
            "host": self._gap / total,
        }
        word = verdict(shares, self.input_threshold, self.host_threshold)
        record = {"epoch": epoch, "verdict": word, "seconds": total, "includes_warmup": warmup}
        record.update({f"{k}_share": v for k, v in shares.items()})
        if known and self._unknown:
            record["calls_without_wait"] = self._unknown
        self.verdicts.append(word)
        self.epochs.append(record)
        if logs is not None:
            for key in KEYS:
                if shares[key] is not None:
                    logs[f"bottleneck_{key}_share"] = shares[key]
        if not known:
            self._say_blind()
        if self.log_dir is not None:
            self._summarize(epoch, shares, word)
        if self.verbose:
            parts = ", ".join(f"{k} {shares[k]:.0%}" for k in KEYS if shares[k] is not None)
            print(f"Bottleneck: epoch {epoch}: {word} ({parts}): {HINTS[word]}")

    def on_train_end(self, logs: dict | None = None) -> None:
        self.expect_call = False
        if self._wrapped:
            _fit_wait.unwrap(self.model)
        if self._writer is not None:
            self._writer.close()
            self._writer = None

    # -- helpers -------------------------------------------------------------------------

    def _say_blind(self) -> None:
        if self._said_blind:
            return
        self._said_blind = True
        spe = getattr(self.model, "steps_per_execution", None)
        why = (
            f"model.fit runs {spe} steps per call (steps_per_execution) and reads their "
            "batches inside one graph call"
            if isinstance(spe, int) and spe > 1
            else "the training loop reports no input wait (logs['input_wait_s'])"
        )
        warnings.warn(
            f"Bottleneck: {why}, so the wait for input cannot be separated from step time: "
            "no input share is logged and the verdict is 'host' or 'compute'. Compile with "
            "steps_per_execution=1 for the diagnosis, or train with tfaccel.Trainer.",
            stacklevel=user_stacklevel(),
        )

    def _summarize(self, epoch: int | None, shares: dict, word: str) -> None:
        import tensorflow as tf

        if self._writer is None:
            self._writer = tf.summary.create_file_writer(self.log_dir)
        step = int(epoch) if epoch is not None else len(self.epochs) - 1
        with self._writer.as_default(step=step):
            for key in KEYS:
                if shares[key] is not None:
                    tf.summary.scalar(f"bottleneck/{key}_share", shares[key])
            tf.summary.text("bottleneck/verdict", word)
        self._writer.flush()
