"""Choose and apply a Keras dtype policy, by measuring; the loss-scaling contract.

"auto" is measured, not a rule. The hardware only names the candidates:

- a GPU: float32, plus `mixed_float16` from compute capability 7.0 (tensor cores) and
  `mixed_bfloat16` from 8.0 (Ampere);
- a CPU: float32, plus `mixed_bfloat16` when the CPU has bf16 instructions (`amx_bf16`
  or `avx512_bf16` in /proc/cpuinfo) and `mixed_float16` when it has float16 ones
  (`amx_fp16`, `avx512_fp16`). Without them a 16-bit type is converted to float32 for
  the arithmetic, so nothing is probed.

With more than one candidate, `choose` times matmuls and a convolution under each
(`precision_probe`, at most ~2 s, once per machine: its rates are cached in a file
under $TFACCEL_CACHE_DIR, default ~/.cache/tfaccel) and `tfaccel.Trainer(...,
precision="auto")` times the user's own training step; both keep float32 unless
another candidate is at least `MIN_GAIN` (5 %) faster. On CPUs with AMX a CNN trained
3.5x faster in `mixed_bfloat16` and a tiny MLP 13 % slower: the choice is per model.

Loss scaling: only float16 needs it. `wrap_optimizer` returns a Keras 3
`LossScaleOptimizer`, whose `scale_loss` scales the loss and whose `apply` unscales
the gradients and skips steps with non-finite gradients (lowering the scale).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import os
import platform
import warnings

import keras

from tfaccel import devices

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
MIN_GAIN = 1.05  # another policy must be this much faster than float32 to be chosen
"""How much faster than float32 another policy must measure to be chosen by "auto"."""
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
"""`/proc/cpuinfo` flags that make `mixed_bfloat16` a candidate on a CPU."""
CPU_FP16_FLAGS = ("amx_fp16", "avx512_fp16")
"""`/proc/cpuinfo` flags that make `mixed_float16` a candidate on a CPU."""
_warned_slow = False


@dataclasses.dataclass(frozen=True)
class Choice:
    """A dtype policy name, the reason it was chosen, and what was measured.

    `rates` maps each candidate to its measured rate (examples/s for a training step,
    FLOP/s for the operation probe); empty when nothing was measured. `source` says
    where rates not measured by this process come from (the operation probe's cache).
    """

    policy: str
    reason: str
    rates: dict = dataclasses.field(default_factory=dict)
    unit: str = ""
    cost_s: float = 0.0  # what measuring took (tracing included)
    source: str = ""

    def describe(self) -> str:
        """One line for a settings table: the choice, why, and the measured rates."""
        if not self.rates:
            return f"{self.policy} ({self.reason})"
        rates = ", ".join(f"{p} {r:,.4g} {self.unit}" for p, r in self.rates.items())
        return f"{self.policy} ({self.reason}; {rates})"


@functools.cache
def _cpuinfo(*fields: str) -> str:
    """The value of the first of `fields` in Linux's /proc/cpuinfo ("" elsewhere)."""
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                if line.startswith(fields) and ":" in line:
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def cpu_flags() -> frozenset:
    """The instruction-set flags of this machine's CPU (Linux /proc/cpuinfo; else empty)."""
    return frozenset(_cpuinfo("flags", "Features").split())


def machine() -> dict:
    """What the operations' rates depend on in the hardware (the probe cache's key): the
    host, the CPU's model, flags and count, and each GPU's name and compute capability."""
    affinity = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else ()
    return {
        "host": platform.node(),
        "platform": platform.platform(),
        "cpu": _cpuinfo("model name", "Hardware", "CPU part") or platform.processor(),
        "cpu_flags": sorted(cpu_flags()),
        "cpus": [os.cpu_count(), len(affinity)],
        "gpus": [[g.name, list(g.compute_capability or ())] for g in devices.list_gpus()],
    }


def candidates(gpus: list[devices.GPU] | None = None, flags=None) -> tuple[list[str], str]:
    """`(policies worth measuring, float32 first; why these)` for `gpus` (default: this
    machine's) or, without GPUs, for a CPU with `flags` (default: this CPU's)."""
    gpus = devices.list_gpus() if gpus is None else list(gpus)
    if gpus:
        capabilities = [g.compute_capability for g in gpus]
        if any(c is None for c in capabilities):
            return ["float32"], "a GPU's compute capability is unknown"
        lowest = min(capabilities)
        if lowest >= (8, 0):
            return (
                ["float32", "mixed_bfloat16", "mixed_float16"],
                f"all GPUs have compute capability >= 8.0 (min {lowest}): bfloat16 and "
                "float16 tensor cores",
            )
        if lowest >= (7, 0):
            return ["float32", "mixed_float16"], f"all GPUs have tensor cores (min {lowest})"
        return ["float32"], f"GPU compute capability {lowest} < 7.0 has no tensor cores"
    flags = cpu_flags() if flags is None else frozenset(flags)
    out = ["float32"]
    bf16 = [f for f in CPU_BF16_FLAGS if f in flags]
    fp16 = [f for f in CPU_FP16_FLAGS if f in flags]
    if bf16:
        out.append("mixed_bfloat16")
    if fp16:
        out.append("mixed_float16")
    if len(out) == 1:
        return out, (
            "no GPU, and this CPU has no bf16 or fp16 instructions "
            f"({', '.join(CPU_BF16_FLAGS + CPU_FP16_FLAGS)}): 16-bit math would run as float32"
        )
    return out, f"no GPU; this CPU has {', '.join(bf16 + fp16)}"


def decide(rates: dict[str, float], unit: str, what: str) -> Choice:
    """The fastest of `rates` (policy → rate, float32 among them); float32 unless the
    fastest beats it by `MIN_GAIN`. `what` names the measurement in the reason."""
    if "float32" not in rates:
        raise ValueError(f"float32 must be measured as the reference, got {sorted(rates)}")
    best = max(rates, key=rates.get)
    gain = rates[best] / rates["float32"] if rates["float32"] > 0 else float("inf")
    if best == "float32":
        return Choice("float32", f"fastest, measured on {what}", dict(rates), unit)
    if gain < MIN_GAIN:
        return Choice(
            "float32",
            f"{best} only {gain:.2f}x float32 (< {MIN_GAIN}x), measured on {what}",
            dict(rates),
            unit,
        )
    return Choice(best, f"{gain:.2f}x float32, measured on {what}", dict(rates), unit)


def choose(gpus: list[devices.GPU] | None = None, flags=None) -> Choice:
    """Chooses the dtype policy for this machine, or for hypothetical `gpus` / CPU `flags`.

    On this machine (both None) several candidates are timed with `precision_probe`
    (matmuls and a convolution, once per machine: `precision_probe.cached_rates`; the
    reason says when the rates were read from its cache). For hypothetical hardware nothing can
    be timed: the rule's pick (the first candidate after float32: bfloat16 where there
    is one) is returned, and the reason says it was not measured.
    """
    policies, why = candidates(gpus, flags)
    if len(policies) == 1:
        return Choice("float32", why)
    if gpus is not None or flags is not None:
        return Choice(policies[1], f"{why} (by rule, not measured)")
    from tfaccel import precision_probe  # TensorFlow work, only when there is a choice

    rates, source = precision_probe.cached_rates(tuple(policies), machine())
    what = f"{precision_probe.WHAT}; {source}" if source else precision_probe.WHAT
    return dataclasses.replace(decide(rates, "FLOP/s", what), source=source)


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
def scope(policy: str = "auto"):
    """Applies `policy` inside a `with` block and restores the previous policy after."""
    previous = keras.config.dtype_policy()
    try:
        yield apply(policy)
    finally:
        keras.config.set_dtype_policy(previous)


def needs_loss_scaling(policy: str | keras.DTypePolicy | None = None) -> bool:
    """True when `policy` (default: the global one) computes in float16."""
    if policy is None:
        policy = keras.config.dtype_policy()
    name = policy.compute_dtype if isinstance(policy, keras.DTypePolicy) else policy
    return "float16" in name and "bfloat16" not in name


def wrap_optimizer(optimizer: keras.optimizers.Optimizer, policy=None):
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
