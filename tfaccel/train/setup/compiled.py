"""What a compiled Keras model brings to the Trainer: optimizer, loss, loss weights, metrics.

`Trainer(model)` with a model that went through `model.compile(...)` takes these from it;
an argument given to the Trainer wins. A model (or optimizer, or metric) whose variables
were created outside the strategy's scope is rebuilt inside it: the model with
`keras.models.clone_model` and its weights copied, the optimizer and metrics from their
configs. The Trainer then trains the copy and copies its weights back to the user's model
when `fit` ends, so code that goes on with `model` (evaluate, save) sees the trained weights.
"""

from __future__ import annotations

import dataclasses
import logging
import numbers
import warnings
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any, TypeAlias

import keras

from tfaccel.train.step.losses import LossSpec, MetricsArg, PerExampleLoss, resolve_metrics

if TYPE_CHECKING:
    import tensorflow as tf

    from tfaccel.train.setup.arguments import OptimizerSpec

logger = logging.getLogger("tfaccel")

# `loss_weights=`: one number, or the one entry of a list or a dict keyed by the output.
LossWeights: TypeAlias = "float | Sequence[float] | dict[str, float] | None"


@dataclasses.dataclass
class CompileSettings:
    """The arguments a model was compiled with (the objects given, not copies)."""

    optimizer: Any = None
    loss: Any = None
    loss_weights: Any = None
    metrics: Any = None
    weighted_metrics: Any = None


def read(model: keras.Model) -> CompileSettings | None:
    """The compile arguments of `model`, or None when it was not compiled."""
    if not isinstance(model, keras.Model) or not getattr(model, "compiled", False):
        return None
    config = getattr(model, "_compile_config", None)
    given = dict(getattr(config, "config", None) or {})
    optimizer = getattr(model, "optimizer", None) or given.get("optimizer")
    # Keras wraps the optimizer under mixed_float16; the Trainer wraps it itself.
    optimizer = getattr(optimizer, "inner_optimizer", optimizer)
    return CompileSettings(
        optimizer=optimizer,
        loss=given.get("loss", getattr(model, "loss", None)),
        loss_weights=given.get("loss_weights"),
        metrics=given.get("metrics"),
        weighted_metrics=given.get("weighted_metrics"),
    )


def choose(explicit: Any, compiled: CompileSettings | None, name: str, default: Any = None) -> Any:
    """An argument given to the Trainer (not None) wins over the compiled model's."""
    if explicit is not None:
        return explicit
    if compiled is not None and getattr(compiled, name) is not None:
        return getattr(compiled, name)
    return default


def _single_output(metrics: Any, name: str) -> MetricsArg:
    if isinstance(metrics, dict):
        raise ValueError(
            f"The model was compiled with {name} per output ({metrics!r}); the Trainer trains "
            f"single-output models. Pass {name}=[...] to the Trainer."
        )
    return metrics


@dataclasses.dataclass
class Resolved:
    """What the Trainer trains with, every object made in the strategy's scope."""

    model: keras.Model
    source_model: keras.Model | None  # the user's model, when `model` is its in-scope copy
    optimizer: keras.optimizers.Optimizer
    loss: LossSpec | None  # None: the model's own steps compute theirs (`model_steps`)
    loss_weight: float
    metrics: MetricsArg
    weighted_metrics: MetricsArg


def resolve(
    model: keras.Model,
    strategy: tf.distribute.Strategy,
    *,
    optimizer: OptimizerSpec | None,
    loss: LossSpec | dict[str, LossSpec] | Sequence[LossSpec] | None,
    loss_weights: LossWeights,
    metrics: MetricsArg,
    weighted_metrics: MetricsArg,
) -> Resolved:
    """The Trainer's arguments, completed from the compiled model (call inside the scope).

    Raises:
        ValueError: no loss anywhere, loss weights or metrics for several outputs, or a
            model built outside the scope that cannot be copied into it.
        TypeError: an optimizer that is not one (see `arguments.build_optimizer`).
    """
    from tfaccel.train.setup.arguments import build_optimizer

    given = read(model)
    refuse_run_eagerly(model, given)
    loss = single_loss(choose(loss, given, "loss"), model)
    require_loss(loss, given)
    model, source = model_in_scope(model, strategy)
    if metrics is None and weighted_metrics is None and given is not None:
        metrics, weighted_metrics = given.metrics, given.weighted_metrics
    chosen_optimizer = build_optimizer(choose(optimizer, given, "optimizer", "adam"))
    resolved = Resolved(
        model=model,
        source_model=source,
        optimizer=optimizer_in_scope(chosen_optimizer, strategy, model),
        loss=loss,
        loss_weight=loss_weight(choose(loss_weights, given, "loss_weights"), model),
        metrics=_single_output(metrics, "metrics"),
        weighted_metrics=_single_output(weighted_metrics, "weighted_metrics"),
    )
    if source is not None and given is not None:
        compile_copy(model, resolved, given, strategy)
    return resolved


def loss_and_metrics(
    resolved: Resolved, strategy: tf.distribute.Strategy
) -> tuple[PerExampleLoss, list[keras.metrics.Metric]]:
    """`(PerExampleLoss, [metrics])` of the Trainer's own step (call inside the scope)."""
    loss = PerExampleLoss(resolved.loss, weight=resolved.loss_weight)
    metrics = resolve_metrics(
        metrics_in_scope(resolved.metrics, strategy),
        loss,
        metrics_in_scope(resolved.weighted_metrics, strategy),
    )
    return loss, metrics


def require_loss(loss: LossSpec | None, compiled: CompileSettings | None) -> None:
    """Raises ValueError when neither the Trainer nor `model.compile` gave a loss."""
    if loss is not None:
        return
    if compiled is None:
        raise ValueError(
            "No loss: pass loss=... to the Trainer (e.g. loss='sparse_categorical_crossentropy'), "
            "or give it a model compiled with model.compile(optimizer, loss, metrics)."
        )
    raise ValueError(
        "The model was compiled without a loss, and the Trainer got none. Pass loss=... to the "
        "Trainer, or compile the model with one: model.compile(optimizer, loss=..., metrics=...)."
    )


def refuse_run_eagerly(model: keras.Model, given: CompileSettings | None) -> None:
    """Raises ValueError for a model compiled with `run_eagerly=True`.

    The Trainer's steps are `tf.function` loops run by a distribution strategy; running
    them eagerly would be another trainer, so the setting is refused, not ignored.
    """
    if given is None or not getattr(model, "run_eagerly", False):
        return
    raise ValueError(
        "The model was compiled with run_eagerly=True, but the Trainer runs its steps as "
        "tf.function loops under a distribution strategy and cannot run them eagerly (code "
        "that calls .numpy() inside the model would fail in the trace). Debug with "
        "model.fit(..., run_eagerly=True), then compile without run_eagerly for the Trainer."
    )


def _output_names(model: keras.Model) -> list[str]:
    try:
        return list(getattr(model, "output_names", None) or [])
    except (AttributeError, ValueError):
        return []


def single_loss(
    loss: LossSpec | dict[str, LossSpec] | Sequence[LossSpec] | None, model: keras.Model
) -> LossSpec | None:
    """The loss of a single-output model: one loss, or the one entry of a dict or list.

    Raises:
        ValueError: losses for several outputs, or a dict key that is not the output's name.
    """
    if not isinstance(loss, (dict, list, tuple)):
        return loss
    names = _output_names(model)
    entries = list(loss.values()) if isinstance(loss, dict) else list(loss)
    wrong_key = isinstance(loss, dict) and names and next(iter(loss), None) not in names
    if len(entries) != 1 or wrong_key:
        raise ValueError(
            f"loss={loss!r} gives {len(entries)} loss(es)"
            + (f" for outputs {list(loss)}" if isinstance(loss, dict) else "")
            + f", but the model's output is {names or 'one tensor'}. The Trainer trains "
            "single-output models: pass one loss (e.g. loss='mse'), or train a multi-output "
            "model with model.fit."
        )
    return entries[0]


def loss_weight(loss_weights: LossWeights, model: keras.Model) -> float:
    """One weight for the loss of a single-output model (Keras' `loss_weights`).

    Raises:
        ValueError: weights for several outputs, or not a number.
    """
    if loss_weights is None:
        return 1.0
    value = loss_weights
    if isinstance(value, dict):
        names = list(getattr(model, "output_names", None) or [])
        if len(value) != 1 or (names and next(iter(value)) not in names):
            raise ValueError(
                f"loss_weights={loss_weights!r} names outputs {list(value)}, but the model's "
                f"output is {names}. The Trainer trains single-output models: give one weight, "
                "e.g. loss_weights=1.0."
            )
        value = next(iter(value.values()))
    elif isinstance(value, (list, tuple)):
        if len(value) != 1:
            raise ValueError(
                f"loss_weights={loss_weights!r} has {len(value)} weights; the Trainer trains "
                "single-output models: give one weight, e.g. loss_weights=1.0."
            )
        value = value[0]
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(
            f"loss_weights must be a number (or one in a list or dict), got {loss_weights!r}."
        )
    return float(value)


def variables_in_scope(variables: Iterable[tf.Variable], strategy: tf.distribute.Strategy) -> bool:
    """Whether every variable was created under `strategy`'s scope."""
    return all(
        strategy.extended.variable_created_in_scope(getattr(v, "value", v)) for v in variables
    )


def optimizer_in_scope(
    optimizer: keras.optimizers.Optimizer,
    strategy: tf.distribute.Strategy,
    model: keras.Model | None = None,
) -> keras.optimizers.Optimizer:
    """`optimizer`, or one made from its config in the scope when its variables are outside it.

    Call inside `strategy.scope()`. An optimizer that already trained (`iterations` > 0)
    continues from its state: the new one is built on `model`'s trainable variables (the
    in-scope copy of the model it trained) and given its step count and slots. When they
    do not match, it starts again, with a warning saying so.
    """
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        return optimizer
    if variables_in_scope(optimizer.variables, strategy):
        return optimizer
    fresh = type(optimizer).from_config(optimizer.get_config())
    steps = int(optimizer.iterations.numpy())
    if not steps:
        return fresh
    if model is not None and _copy_state(optimizer, fresh, model):
        logger.info(
            "The optimizer (%s) was created outside the strategy's scope after %d steps; the "
            "Trainer's copy made inside it continues from its step count and slots.",
            type(optimizer).__name__,
            steps,
        )
        return fresh
    fresh = type(optimizer).from_config(optimizer.get_config())  # unbuilt again
    warnings.warn(
        f"The optimizer ({type(optimizer).__name__}) was created outside the strategy's "
        f"scope and has trained {steps} steps, on variables that do not match the model's. "
        "The Trainer trains with a new one made from its config: the step count (and a "
        "learning rate schedule) restart from 0 and its slots (momentum, moments) are "
        "empty. To continue, build the model and optimizer inside `with strategy.scope():`, "
        "or resume from a Trainer checkpoint (fit(checkpoint_dir=...)).",
        stacklevel=3,
    )
    return fresh


def _copy_state(
    old: keras.optimizers.Optimizer, new: keras.optimizers.Optimizer, model: keras.Model
) -> bool:
    """Builds `new` on `model`'s trainable variables and gives it `old`'s variables (in
    order, every shape equal); False when they do not match (then `new` is not used)."""
    if not old.built:
        return False
    try:
        new.build(model.trainable_variables)
    except (ValueError, TypeError):
        return False
    pairs = list(zip(new.variables, old.variables, strict=False))
    if len(new.variables) != len(old.variables) or any(
        tuple(a.shape) != tuple(b.shape) or a.dtype != b.dtype for a, b in pairs
    ):
        return False
    for target, source in pairs:
        target.assign(source.value)
    return True


def metrics_in_scope(metrics: MetricsArg, strategy: tf.distribute.Strategy) -> MetricsArg:
    """Metric objects made outside the scope are remade from their configs (inside it).

    Takes what `metrics=` takes (None, one metric or name, a list); returns a list or None.
    """
    if metrics is None:
        return None
    items = list(metrics) if isinstance(metrics, (list, tuple)) else [metrics]
    out = []
    for metric in items:
        if isinstance(metric, keras.metrics.Metric) and not variables_in_scope(
            metric.variables, strategy
        ):
            metric = type(metric).from_config(metric.get_config())
        out.append(metric)
    return out


def model_in_scope(
    model: keras.Model, strategy: tf.distribute.Strategy
) -> tuple[keras.Model, keras.Model | None]:
    """`(model to train, the user's model to copy weights back to, or None)`.

    A model whose variables were created outside `strategy`'s scope is cloned inside
    it (call this inside `strategy.scope()`) with the same weights.

    Raises:
        ValueError: the model cannot be cloned (e.g. a subclassed model without
            `get_config`); the message says how to build it in the scope instead.
    """
    if variables_in_scope(model.variables, strategy):
        return model, None
    try:
        clone = keras.models.clone_model(model)
        if not clone.built or len(clone.weights) != len(model.weights):
            raise ValueError(
                f"the clone has {len(clone.weights)} weights, the model {len(model.weights)}"
            )
        clone.set_weights(model.get_weights())
    except Exception as error:  # noqa: BLE001 - re-raised with what to do
        raise ValueError(
            f"The model's variables (e.g. {[v.path for v in model.variables][:3]}) were created "
            f"outside the Trainer's strategy ({type(strategy).__name__}), and copying the model "
            f"into its scope failed ({type(error).__name__}: {error}). Build (and compile) the "
            "model inside `with strategy.scope():`, or pass a function that builds it: "
            "Trainer(build_model, ...)."
        ) from error
    logger.info(
        "The model was built outside the strategy's scope: the Trainer trains a copy made "
        "inside it and copies the weights back to your model when fit ends."
    )
    return clone, model


def compile_copy(
    copy: keras.Model, resolved: Resolved, given: CompileSettings, strategy: tf.distribute.Strategy
) -> None:
    """Compiles the in-scope copy as the user's model was (for `evaluate` / `save` on it)."""
    try:
        copy.compile(
            optimizer=resolved.optimizer,
            loss=resolved.loss,
            loss_weights=given.loss_weights,
            metrics=metrics_in_scope(given.metrics, strategy),
            weighted_metrics=metrics_in_scope(given.weighted_metrics, strategy),
        )
    except Exception as error:  # noqa: BLE001 - the Trainer does not need it compiled
        logger.info("The model's in-scope copy was not compiled (%s).", error)


def copy_weights_back(model: keras.Model, source_model: keras.Model | None) -> None:
    """After `fit`: `model`'s trained weights into the user's `source_model` when the
    Trainer trained a copy (None: it trained the user's model itself)."""
    if source_model is not None:
        source_model.set_weights(model.get_weights())
