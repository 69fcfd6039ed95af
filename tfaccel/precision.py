"""Choose and apply a Keras dtype policy, by measuring; the loss-scaling contract.

"auto" is measured, not a rule: the hardware names the candidates (`candidates`: float32,
plus the 16-bit policies its tensor cores or CPU instructions run natively) and `choose`
times matmuls and a convolution under each (once per machine, cached in a file under
$TFACCEL_CACHE_DIR, default ~/.cache/tfaccel); `tfaccel.Trainer(..., precision="auto")`
times the user's own training step. Both keep float32 unless another candidate is at least
5 % faster. The choice itself lives with tfaccel's other measured choices
(`tfaccel.choices.policy`); this module applies it.

Loss scaling: only float16 needs it. `wrap_optimizer` returns a Keras 3
`LossScaleOptimizer`, whose `scale_loss` scales the loss and whose `apply` unscales
the gradients and skips steps with non-finite gradients (lowering the scale).
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator

import keras

from tfaccel import devices
from tfaccel.choices.copies import global_policy
from tfaccel.choices.policy import (  # noqa: F401 - this module's public names
    CPU_BF16_FLAGS,
    CPU_FP16_FLAGS,
    MIN_GAIN,
    candidates,
    choose,
    cpu_flags,
    decide,
    machine,
)
from tfaccel.choices.policy import PolicyChoice as Choice

__all__ = [
    "Choice",
    "apply",
    "candidates",
    "choose",
    "needs_loss_scaling",
    "resolve",
    "scope",
    "wrap_optimizer",
]

POLICIES = ("float32", "mixed_float16", "mixed_bfloat16", "float16", "bfloat16", "float64")
"""The Keras dtype policy names `apply` accepts (besides "auto")."""
_warned_slow = False


def resolve(policy: str = "auto", gpus: list[devices.GPU] | None = None) -> str:
    """Returns a concrete policy name for `policy` ("auto" → `choose`).

    Raises:
        ValueError: an unknown policy name.
    """
    if isinstance(policy, keras.DTypePolicy):
        return policy.name
    if policy == "auto":
        return choose(gpus).policy
    if policy not in POLICIES:
        raise ValueError(f"Unknown dtype policy {policy!r}; expected 'auto' or one of {POLICIES}.")
    if policy in ("mixed_float16", "float16"):
        _warn_if_slow(policy, gpus)
    return policy


def _warn_if_slow(policy: str, gpus: list[devices.GPU] | None) -> None:
    global _warned_slow
    gpus = devices.list_gpus() if gpus is None else gpus
    capable = gpus and all(g.compute_capability and g.compute_capability >= (7, 0) for g in gpus)
    if not capable and not _warned_slow:
        _warned_slow = True
        warnings.warn(
            f"{policy} was requested but no GPU with tensor cores (compute capability >= 7.0) "
            "is visible: float16 math will be much slower than float32 here. "
            "Use policy='auto' to choose from the hardware.",
            stacklevel=3,
        )


def apply(policy: str = "auto") -> keras.DTypePolicy:
    """Sets the Keras global dtype policy and returns it."""
    keras.config.set_dtype_policy(resolve(policy))
    return keras.config.dtype_policy()


@contextlib.contextmanager
def scope(policy: str = "auto") -> Iterator[keras.DTypePolicy]:
    """Applies `policy` inside a `with` block and restores the previous policy after."""
    with global_policy(resolve(policy)) as applied:
        yield applied


def needs_loss_scaling(policy: str | keras.DTypePolicy | None = None) -> bool:
    """True when `policy` (default: the global one) computes in float16."""
    if policy is None:
        policy = keras.config.dtype_policy()
    name = policy.compute_dtype if isinstance(policy, keras.DTypePolicy) else policy
    return "float16" in name and "bfloat16" not in name


def wrap_optimizer(
    optimizer: keras.optimizers.Optimizer | str,
    policy: str | keras.DTypePolicy | None = None,
) -> keras.optimizers.Optimizer:
    """Returns a `LossScaleOptimizer` around `optimizer` when the policy needs it.

    Args:
        optimizer: a Keras optimizer or its name, e.g. "adam" (an existing
            LossScaleOptimizer is returned as is).
        policy: a policy name or object; default the global policy.

    Raises:
        ValueError: an optimizer name Keras does not know.
        TypeError: anything else that is not a Keras optimizer.
    """
    if isinstance(optimizer, str):
        try:
            optimizer = keras.optimizers.get(optimizer)
        except ValueError:
            raise ValueError(
                f"Unknown optimizer name {optimizer!r}. Use a Keras optimizer name such as "
                "'adam', 'sgd', 'rmsprop' or 'adamw', or pass an optimizer object, e.g. "
                "keras.optimizers.SGD(0.1)."
            ) from None
    if not isinstance(optimizer, keras.optimizers.Optimizer):
        raise TypeError(
            f"wrap_optimizer needs a Keras optimizer (or its name), got {optimizer!r} "
            f"({type(optimizer).__name__}). Pass e.g. keras.optimizers.Adam(1e-3) or 'adam'."
        )
    if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        return optimizer
    if needs_loss_scaling(policy):
        return keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer
