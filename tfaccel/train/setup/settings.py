"""Resolving the Trainer's "auto" settings, and the table that says what was decided."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from tfaccel import cluster
from tfaccel.choices.xla import unsupported_jit_layers
from tfaccel.train.setup import model_steps
from tfaccel.train.step.losses import loss_scale_of

if TYPE_CHECKING:
    from tfaccel.choices.choice import Choice
    from tfaccel.choices.loop_size import LoopSizer
    from tfaccel.choices.xla import XlaChoice
    from tfaccel.data import Feed
    from tfaccel.train.setup.methods_setup import Methods
    from tfaccel.train.setup.model_steps import ModelSteps
    from tfaccel.train.step.runner import Runner


def resolve_jit_compile(
    value: bool | str, model: keras.Model, strategy: tf.distribute.Strategy
) -> bool:
    """`"auto"` is False until measured at the first fit (`tfaccel.choices.xla`); True or False
    as given.
    A model running its own steps (`model_steps`) follows its compile setting for "auto"
    (`model.jit_compile`, Keras's "auto" resolved), as `model.fit` does, unmeasured.

    Raises:
        ValueError: `jit_compile=True` with a layer that does not support XLA.
    """
    bad = unsupported_jit_layers(model)
    if value is True and bad:
        raise ValueError(
            f"jit_compile=True, but layer(s) {bad} do not support XLA (supports_jit=False). "
            "Pass jit_compile=False or 'auto'."
        )
    if value == "auto":
        return bool(model_steps.overridden(model)) and bool(getattr(model, "jit_compile", False))
    if not isinstance(value, bool):
        raise ValueError(f"jit_compile must be True, False or 'auto', got {value!r}.")
    return value


def xla_after(runner: Runner, choice: XlaChoice | None) -> tuple[XlaChoice | None, bool]:
    """The XLA choice and `jit_compile` a fit leaves: where the first loops chose XLA
    online (`Runner.alternation`), its verdict (until decided, the step running now);
    else `choice` and the runner's setting, as resolved before step 1."""
    ab = runner.alternation
    if ab is None:
        return choice, runner.jit_compile
    return ab.choice(), ab.jit_compile


def format_table(settings: dict[str, Any]) -> str:
    """Renders resolved settings as a two-column table."""
    width = max(len(key) for key in settings)
    lines = ["tfaccel.Trainer settings", "-" * (width + 30)]
    lines += [f"{key:<{width}}  {value}" for key, value in settings.items()]
    return "\n".join(lines)


def resolve(
    runner: Runner,
    feed: Feed,
    steps_per_epoch: int | None,
    sizer: LoopSizer,
    precision: Choice | None = None,
    jit: Choice | None = None,
    model_steps: ModelSteps | None = None,
    methods: Methods | None = None,
) -> dict[str, Any]:
    """The settings table of one `fit`: what the Trainer resolved, each in words.

    Args:
        runner: the inner loop (its strategy, model, optimizer, accumulation, on_oom split
            and jit_compile are read).
        feed: the training `Feed`.
        steps_per_epoch: applied steps per epoch (None: until the data ends).
        sizer: the `LoopSizer` (steps per loop, and why).
        precision: the dtype policy's choice (its `describe()`), or None: the model's.
        jit: the XLA choice (its `describe()`), or None: `runner.jit_compile`. One to be
            chosen online starts the runner's A/B (`Runner.alternate_xla`), which
            rewrites the table's row once decided.
        model_steps: a model's own steps (`model_steps.ModelSteps`: its row), or None.
        methods: the Trainer's `methods_setup.Methods` (a row per method), or None.
    """
    strategy = runner.strategy
    replicas = strategy.num_replicas_in_sync
    policy = runner.model.dtype_policy.name
    global_batch = feed.global_batch
    per_replica = global_batch // replicas if global_batch else None
    k = runner.batches_per_step
    table = {
        "strategy": type(strategy).__name__,
        **(model_steps.rows() if model_steps else {}),
        "cluster": cluster.source_of(strategy),
        "replicas": replicas,
        "per_replica_batch": per_replica,
        "global_batch": global_batch,
        "accumulate_steps": k,
        "effective_global_batch": global_batch * k if global_batch else None,
        "on_oom": _on_oom_text(runner),
        "drop_remainder": _dropped_text(feed),
        "dtype_policy": precision.describe() if precision else policy,
        "loss_scale": loss_scale_of(runner.optimizer) or "none",
        "jit_compile": jit.describe() if jit else runner.jit_compile,
        "steps_per_epoch": _steps_text(steps_per_epoch, k),
        "steps_per_loop": sizer.describe(steps_per_epoch),
        "devices": _device_names(strategy),
        **({"input_service": feed.service.describe()} if feed.service is not None else {}),
        "input_order": _order_text(feed),
        **(methods.rows() if methods else {}),
    }
    if getattr(jit, "online", False):  # the first loops decide: their row is this table's
        runner.alternate_xla(table, lambda: not sizer.measuring, steps_per_epoch)
    return table


def _order_text(feed: Feed) -> str:
    """Whether a resume may change the worker count (see `tfaccel.data.order.global_order`)."""
    pipelines = f"{feed.pipelines} input pipeline(s)"
    if feed.order == "global":
        return f"global ({pipelines}): resumes exactly on any number of workers or replicas"
    return (
        f"sharded ({pipelines}; {feed.order}): resumes exactly on any number of replicas, "
        f"but only on {feed.pipelines} worker(s)"
    )


def _on_oom_text(runner: Runner) -> str:
    if runner.micro_batches == 1:
        return runner.on_oom
    return f"accumulate: {runner.micro_batches} micro-batches per batch"


def _dropped_text(feed: Feed) -> bool | str:
    dropped = feed.dropped
    if not feed.drop_remainder or dropped is None:
        return feed.drop_remainder
    return f"True ({dropped[0]} of {dropped[1]} dropped)"


def _steps_text(steps: int | None, accumulate_steps: int) -> int | str:
    if not steps:
        return "until the data ends"
    if accumulate_steps == 1:
        return steps
    return f"{steps} ({steps * accumulate_steps} batches)"


def _device_names(strategy: tf.distribute.Strategy) -> str:
    try:
        return ", ".join(strategy.extended.worker_devices)
    except RuntimeError:  # the default strategy places ops on TensorFlow's default device
        gpus = tf.config.list_logical_devices("GPU")
        return (gpus or tf.config.list_logical_devices("CPU"))[0].name
