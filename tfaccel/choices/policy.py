"""Which dtype policies this hardware offers, and which of them its operations favour.

"auto" is measured, not a rule. The hardware only names the candidates:

- a GPU: float32, plus `mixed_float16` from compute capability 7.0 (tensor cores) and
  `mixed_bfloat16` from 8.0 (Ampere);
- a CPU: float32, plus `mixed_bfloat16` when the CPU has bf16 instructions (`amx_bf16`
  or `avx512_bf16` in /proc/cpuinfo) and `mixed_float16` when it has float16 ones
  (`amx_fp16`, `avx512_fp16`). Without them a 16-bit type is converted to float32 for
  the arithmetic, so nothing is probed.

With more than one candidate, `choose` times matmuls and a convolution under each
(`operations`, at most ~2 s, once per machine: its rates are cached in a file under
$TFACCEL_CACHE_DIR, default ~/.cache/tfaccel) and `tfaccel.Trainer(...,
precision="auto")` times the user's own training step (`timing`, `resolution`); both
keep float32 unless another candidate is at least `MIN_GAIN` (5 %) faster, and the Trainer
adopts a faster policy only when the paired loss check (`outcome`) finds it does not cost
the path. On CPUs with AMX a CNN trained 3.5x faster in `mixed_bfloat16` and a tiny MLP
13 % slower: the choice is per model. A job too short to time the model
(`timing.too_short`) keeps the model's policy (`by_operations` names the operations'
pick when it is `RULE_GAIN` (1.5x) float32's or more, not adopted untimed and unchecked).
On a multi-worker job the workers decide from the same rates (`operations_choice`): each
worker's own reading, or one read from the cache while another measured, would let one
time the model (collectives the others never call) or copy it under another policy.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import platform
from collections.abc import Iterable
from typing import TYPE_CHECKING

from tfaccel import devices
from tfaccel.choices.agreement import agree, is_multi_worker
from tfaccel.choices.choice import Choice

if TYPE_CHECKING:
    import tensorflow as tf

MIN_GAIN = 1.05  # another policy must be this much faster than float32 to be chosen
"""How much faster than float32 another policy must measure to be chosen by "auto"."""
RULE_GAIN = 1.5  # a job too short to time: the operations' pick named when this much faster
"""How much faster than float32's the operations' pick must be to be named (not adopted)."""
CPU_BF16_FLAGS = ("amx_bf16", "avx512_bf16")
"""`/proc/cpuinfo` flags that make `mixed_bfloat16` a candidate on a CPU."""
CPU_FP16_FLAGS = ("amx_fp16", "avx512_fp16")
"""`/proc/cpuinfo` flags that make `mixed_float16` a candidate on a CPU."""


@dataclasses.dataclass(frozen=True)
class PolicyChoice(Choice):
    """A dtype policy name, the reason it was chosen, and what was measured (a `Choice`).

    `rates` (the figures) maps each candidate to its measured rate (examples/s for a
    training step, FLOP/s for the operation probe); empty when nothing was measured.
    `source` says where rates not measured by this process come from (the operation
    probe's cache).
    """

    @property
    def policy(self) -> str:
        """The chosen policy's name (the value)."""
        return str(self.value)


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


def candidates(
    gpus: list[devices.GPU] | None = None, flags: Iterable[str] | None = None
) -> tuple[list[str], str]:
    """`(policies worth measuring, float32 first; why these)` for `gpus` (default: this
    machine's) or, without GPUs, for a CPU with `flags` (default: this CPU's)."""
    gpus = devices.list_gpus() if gpus is None else list(gpus)
    if gpus:
        capabilities = [g.compute_capability for g in gpus]
        if any(c is None for c in capabilities):
            return ["float32"], "a GPU's compute capability is unknown"
        lowest = min(c for c in capabilities if c is not None)
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


def decide(rates: dict[str, float], unit: str, what: str) -> PolicyChoice:
    """The fastest of `rates` (policy → rate, float32 among them); float32 unless the
    fastest beats it by `MIN_GAIN`. `what` names the measurement in the reason."""
    if "float32" not in rates:
        raise ValueError(f"float32 must be measured as the reference, got {sorted(rates)}")
    best = max(rates, key=lambda p: rates[p])
    gain = rates[best] / rates["float32"] if rates["float32"] > 0 else float("inf")
    if best == "float32":
        return PolicyChoice("float32", f"fastest, measured on {what}", dict(rates), unit)
    if gain < MIN_GAIN:
        return PolicyChoice(
            "float32",
            f"{best} only {gain:.2f}x float32 (< {MIN_GAIN}x), measured on {what}",
            dict(rates),
            unit,
        )
    return PolicyChoice(best, f"{gain:.2f}x float32, measured on {what}", dict(rates), unit)


def choose(
    gpus: list[devices.GPU] | None = None, flags: Iterable[str] | None = None
) -> PolicyChoice:
    """Chooses the dtype policy for this machine, or for hypothetical `gpus` / CPU `flags`.

    On this machine (both None) several candidates are timed with `operations`
    (matmuls and a convolution, once per machine: `operations.cached_rates`; the reason
    says when the rates were read from its cache, `cost_s` what measuring them took). For
    hypothetical hardware nothing can be timed: the rule's pick (the first candidate after
    float32: bfloat16 where there is one) is returned, and the reason says it was not
    measured.
    """
    policies, why = candidates(gpus, flags)
    if len(policies) == 1:
        return PolicyChoice("float32", why)
    if gpus is not None or flags is not None:
        return PolicyChoice(policies[1], f"{why} (by rule, not measured)")
    from tfaccel.choices import operations  # TensorFlow work, only when there is a choice

    rates, source, cost_s = operations.cached_rates(tuple(policies), machine())
    what = f"{operations.WHAT}; {source}" if source else operations.WHAT
    return dataclasses.replace(decide(rates, "FLOP/s", what), source=source, cost_s=cost_s)


def operations_choice(strategy: tf.distribute.Strategy | None = None) -> PolicyChoice:
    """`choose()` (the operations' rates, once per machine); on a multi-worker job every
    rate is agreed first (the largest any worker read), so that every worker makes the same
    decisions from them."""
    ops = choose()
    if strategy is None or not ops.rates or not is_multi_worker(strategy):
        return ops
    rates = {p: agree(strategy, r) for p, r in sorted(ops.rates.items())}
    what = "the operations' rates, each the largest any worker read"
    return dataclasses.replace(decide(rates, ops.unit, what), source=ops.source)


def by_operations(kept: str, short: str, ops: PolicyChoice | None = None) -> PolicyChoice:
    """A job too short to time the model (`short` says why): `kept`, whatever the
    operations' rates (`ops`, default this machine's) say. Another policy changes the
    numerics, and a faster step is adopted only after the paired loss check
    (`outcome`), which such a job has no room for: the reason names the operations' pick
    and that it was not adopted."""
    ops = ops or choose()
    gain = ops.rates.get(ops.policy, 0.0) / ops.rates.get("float32", float("inf"))
    if ops.policy != kept and gain >= RULE_GAIN:
        return PolicyChoice(
            kept,
            f"kept: not measured ({short}); the operations' pick {ops.policy} "
            f"({gain:.2f}x float32's) changes the numerics, not adopted untimed and "
            "without the paired loss check"
            + (f"; the operations' {ops.source}" if ops.source else ""),
            dict(ops.rates),
            ops.unit,
        )
    return PolicyChoice(kept, f"kept: not measured ({short})")
