"""A model with its own steps: which Keras hooks it overrides, and what the Trainer refuses.

`model.fit` calls the model's `train_step` (and, through Keras's own `train_step`, its
`compute_loss` and `compute_metrics`) and `evaluate` its `test_step`. A model that
overrides any of these is trained by the Trainer the same way (`step.user_step`): its
own steps inside the Trainer's loops, strategy, steps per loop, callbacks and
checkpoints. What only the Trainer's own step can do — its loss, metrics and loss
weights, gradient accumulation, the out-of-memory split, a dtype policy applied to a
copy, `methods=` — is refused before step 1, with the way out.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import TYPE_CHECKING

import keras

from tfaccel.train.setup import compiled, methods_setup
from tfaccel.train.setup.arguments import OptimizerSpec, build_optimizer
from tfaccel.train.step.losses import LossSpec, MetricsArg, PerExampleLoss

if TYPE_CHECKING:
    import tensorflow as tf

HOOKS = ("train_step", "test_step", "compute_loss", "compute_metrics")


def overridden(model: keras.Model) -> list[str]:
    """The hooks of `HOOKS` that `model` (its class or the object) overrides."""
    found = []
    for name in HOOKS:
        own = getattr(model, name, None)
        if getattr(own, "__func__", own) is not getattr(keras.Model, name):
            found.append(name)
    return found


@dataclasses.dataclass(frozen=True)
class ModelSteps:
    """The Trainer runs `model`'s own steps because it overrides `hooks`."""

    model: keras.Model = dataclasses.field(repr=False, compare=False)
    hooks: tuple[str, ...]

    @property
    def model_class(self) -> str:
        return type(self.model).__name__

    @property
    def names(self) -> str:
        """The overridden hooks as `Class.hook` names, e.g. "GAN.train_step"."""
        return ", ".join(f"{self.model_class}.{hook}" for hook in self.hooks)

    def rows(self) -> dict[str, str]:
        """The settings-table row that says the model's own steps run."""
        return {
            "train_step": f"the model's own ({self.names} overridden): its train_step and "
            "test_step run per replica, as in model.fit; jit_compile='auto' is the model's "
            "compile setting (model.jit_compile), not measured"
        }

    def refuse(self, argument: str, why: str, fix: str, or_fit: bool = True) -> None:
        """Raises ValueError naming the overrides, what cannot be done, and the way out
        (`or_fit`: also "or train the model with model.fit")."""
        other = ", or train the model with model.fit" if or_fit else ""
        raise ValueError(
            f"{self.model_class} overrides {', '.join(self.hooks)}, so the Trainer runs the "
            f"model's own steps as model.fit does; {argument} {why}. {fix}{other}."
        )

    def check(self, **given: object) -> None:
        """Refuses the Trainer arguments the model's own steps cannot honour (see the
        module docstring); `given` holds the Trainer's arguments by name.

        Raises:
            ValueError: one of them is set.
        """
        for name in ("loss", "loss_weights", "metrics", "weighted_metrics"):
            if given.get(name) is not None:
                self.refuse(
                    f"{name}=",
                    "would be ignored: the model's steps compute the loss and metrics "
                    "compiled into the model (or their own)",
                    f"Compile the model with it (model.compile(..., {name}=...)) and leave "
                    "it out of the Trainer",
                )
        if given.get("accumulate_steps", 1) != 1:
            self.refuse(
                f"accumulate_steps={given['accumulate_steps']}",
                "needs the Trainer's own step (the model's train_step applies its gradients "
                "itself)",
                "Use a larger batch, or accumulate inside train_step",
            )
        if given.get("on_oom", "raise") != "raise":
            self.refuse(
                f"on_oom={given['on_oom']!r}",
                "needs the Trainer's own step (it splits a batch into accumulated micro-batches)",
                "Use on_oom='raise' with a batch that fits",
            )
        if given.get("precision") is not None:
            self.refuse(
                f"precision={given['precision']!r}",
                "would train a copy of the model, without the state its compile() gave it",
                "Set the policy before building and compiling the model "
                "(keras.mixed_precision.set_global_policy(...)) and leave precision=None",
            )
        methods = given.get("methods")
        if not methods_setup.no_methods(methods):
            self.refuse(
                f"methods={methods!r}",
                "needs the Trainer's own step (the methods change its loss, labels and optimizer)",
                "Leave methods=None, or use tfaccel.methods.for_fit(...) with model.fit",
            )


def of(model: keras.Model) -> ModelSteps | None:
    """The model's own steps, when it overrides one of `HOOKS`; else None."""
    hooks = overridden(model)
    if not hooks:
        return None
    return ModelSteps(model, tuple(hooks))


def resolve_model(
    model: keras.Model,
    strategy: tf.distribute.Strategy,
    *,
    optimizer: OptimizerSpec | None,
    loss: LossSpec | dict[str, LossSpec] | Sequence[LossSpec] | None,
    loss_weights: compiled.LossWeights,
    metrics: MetricsArg,
    weighted_metrics: MetricsArg,
    **trainer_only: object,
) -> tuple[ModelSteps | None, compiled.Resolved, PerExampleLoss | None, list[keras.metrics.Metric]]:
    """`(ModelSteps or None, compiled.Resolved, PerExampleLoss or None, [metrics])` for the
    Trainer (call inside the scope): a model with its own steps, checked
    (`ModelSteps.check`, also of `trainer_only`: the Trainer's `accumulate_steps`,
    `on_oom`, `precision`, `methods`) and resolved (`resolve`); any other through
    `compiled.resolve`, with the loss and metrics of the Trainer's own step."""
    steps = of(model)
    if steps is None:
        resolved = compiled.resolve(
            model,
            strategy,
            optimizer=optimizer,
            loss=loss,
            loss_weights=loss_weights,
            metrics=metrics,
            weighted_metrics=weighted_metrics,
        )
        return (None, resolved, *compiled.loss_and_metrics(resolved, strategy))
    steps.check(
        loss=loss,
        loss_weights=loss_weights,
        metrics=metrics,
        weighted_metrics=weighted_metrics,
        **trainer_only,
    )
    return steps, resolve(steps, model, strategy, optimizer), None, []


def resolve(
    steps: ModelSteps,
    model: keras.Model,
    strategy: tf.distribute.Strategy,
    optimizer: OptimizerSpec | None,
) -> compiled.Resolved:
    """The model and optimizer the model's own steps train with (call inside the scope).

    The model must be compiled (as `model.fit` requires), not with `run_eagerly=True`,
    and built under `strategy`'s scope (a copy would lose what its `compile` set up). An
    `optimizer` given to the Trainer becomes `model.optimizer` (`self.optimizer` in the
    step); otherwise the compiled one is used as it is.

    Raises:
        ValueError: a model not compiled, compiled with `run_eagerly=True`, or made
            outside the scope.
        TypeError: an optimizer that is not one (`arguments.build_optimizer`).
    """
    if not getattr(model, "compiled", False):
        steps.refuse(
            "the model is not compiled",
            "and its steps need what compile() sets up (the optimizer, loss and metrics)",
            "Call model.compile(...) first, as model.fit requires",
            or_fit=False,
        )
    compiled.refuse_run_eagerly(model, compiled.read(model))
    if not compiled.variables_in_scope(model.variables, strategy):
        steps.refuse(
            f"the model was built outside the strategy's scope ({type(strategy).__name__})",
            "and a copy would lose what its compile() set up",
            "Build and compile the model inside `with strategy.scope():`, or pass a "
            "function that builds and compiles it: Trainer(build_model, ...)",
        )
    chosen = model.optimizer
    if optimizer is not None:
        chosen = compiled.optimizer_in_scope(build_optimizer(optimizer), strategy, model)
    return compiled.Resolved(
        model=model,
        source_model=None,
        optimizer=chosen,
        loss=None,
        loss_weight=1.0,
        metrics=None,
        weighted_metrics=None,
    )
