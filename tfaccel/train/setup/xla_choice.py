"""Moved to `tfaccel.choices` (warns on import; see `tfaccel.choices.moved`)."""

from tfaccel.choices import moved

__getattr__ = moved.forward(
    "tfaccel.train.setup.xla_choice", "tfaccel.choices.xla", "tfaccel.choices.timing"
)


def choose_autos(trainer, feed, steps_per_epoch, epochs: int) -> tuple:
    """The Trainer's old entry to its "auto" precision and XLA (until `Trainer.fit` calls
    `tfaccel.choices.resolve_fit`)."""
    from tfaccel.choices import resolution

    step = resolution.Step(
        trainer.model,
        trainer.loss,
        trainer.strategy,
        trainer._builder,
        trainer.jit_compile,
        trainer.runner.loops is not None,
    )
    asked = resolution.Asked(
        trainer._auto_precision and trainer.precision_choice is None,
        trainer._auto_jit and trainer.jit_choice is None,
    )
    return resolution._policy_and_xla(step, asked, resolution.Job(feed, steps_per_epoch, epochs))
