"""Resolving the Trainer's "auto" settings, and the table that says what was decided."""

from __future__ import annotations

import keras
import tensorflow as tf


def unsupported_jit_layers(model) -> list[str]:
    """Names of the model (e.g. a `PipelineModel`) or its layers with `supports_jit = False`."""
    return [
        layer.name
        for layer in model._flatten_layers(include_self=True)
        if not getattr(layer, "supports_jit", True)
    ]


def resolve_jit_compile(value, model, strategy) -> bool:
    """`"auto"`: XLA on a GPU, single replica, when every layer supports it; never on CPU.

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
        return bool(
            tf.config.list_logical_devices("GPU")
            and strategy.num_replicas_in_sync == 1
            and not bad
            and not tf.config.is_op_determinism_enabled()
        )
    if not isinstance(value, bool):
        raise ValueError(f"jit_compile must be True, False or 'auto', got {value!r}.")
    return value


def loss_scale_of(optimizer) -> float | None:
    """The current dynamic loss scale, or None when the optimizer does not scale."""
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        if optimizer.built:
            return float(optimizer.dynamic_scale.numpy())
        return float(optimizer.initial_scale)
    return None


def format_table(settings: dict) -> str:
    """Renders resolved settings as a two-column table."""
    width = max(len(key) for key in settings)
    lines = ["tfaccel.Trainer settings", "-" * (width + 30)]
    lines += [f"{key:<{width}}  {value}" for key, value in settings.items()]
    return "\n".join(lines)
