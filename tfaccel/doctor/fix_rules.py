"""The fixes the doctor proposes for each stage, with their predicted gains.

`verdict.fixes` ranks what these rules propose; the arithmetic of a step (its parts,
the modelled step with a fix) is in `verdict`.
"""

from __future__ import annotations

from tfaccel.choices import loop_size
from tfaccel.data.assembly.plan import missing
from tfaccel.doctor.service_fix import service_fixes
from tfaccel.doctor.verdict import (
    COMMUNICATION_TARGET,
    MAX_ACCUMULATE,
    MEMORY_FULL,
    NEAR_PEAK,
    Fix,
    Measured,
    _gain,
    _input_gain,
    cached_step_s,
    compute_fraction_of_peak,
    effective_input_s,
    memory_fraction,
    parts,
    verdict,
    worth_listing,
)


def input_fixes(m: Measured) -> list[Fix]:
    """From what the pipeline lacks (`tfaccel.data.assembly.plan.missing`, the words `explain`
    uses), each predicted from its mechanism: parallel reading and parallel maps timed
    with the fix applied to the pipeline's graph (`input_speedups`; else a model: the
    maps on all cores), prefetch overlapping the input with the step, a cache removing
    the input's work from the second epoch."""
    t_in = effective_input_s(m)
    speedups = m.input_speedups or {}
    out = []
    for key, words in missing(m.pipeline):
        what = words.split(": ", 1)[1].split(" (")[0]  # the problem, not the remedy
        if key == "parallel_source":
            measured = speedups.get("parallel_source")
            action = f"tfaccel.data.from_generator(fn, shards={m.source_shards})"
            out.append(_input_fix(m, action, measured, what, t_in, m.source_shards))
        elif key == "parallel_map":
            measured = speedups.get("parallel_map")
            action = "map(..., num_parallel_calls=tf.data.AUTOTUNE)"
            out.append(_input_fix(m, action, measured, what, t_in, m.cores))
        elif key == "prefetch":
            out.append(
                Fix(
                    "input",
                    "end the pipeline with .prefetch(tf.data.AUTOTUNE)",
                    _input_gain(m, prefetch=True),
                    f"{what}; with it the input overlaps the step",
                )
            )
        elif key == "cache":
            out.append(
                Fix(
                    "input",
                    "cache() after the maps (augment after it)",
                    _input_gain(m, t_in=0.0),
                    f"{what}; from the second epoch their output is read back from memory "
                    "or disk (tfaccel.data.pipeline(cache=...)); the prediction is for the "
                    "epochs after the first",
                    condition="if the maps are deterministic and their output fits",
                )
            )
    if not out:
        out.append(
            Fix(
                "input",
                "a faster source: interleave(num_parallel_calls=AUTOTUNE) over files, "
                "TFRecords on local disk, or the tf.data service",
                None,
                "the pipeline is parallel, cached and prefetched already; its source limits it",
            )
        )
    return out + service_fixes(m)


def _input_fix(
    m: Measured, action: str, measured: float | None, what: str, t_in: float, model: int
) -> Fix:
    """A fix that makes the input `measured` times faster (else `model` times, unmeasured)."""
    speedup = measured if measured is not None else float(max(model, 1))
    how = (
        f"measured: the pipeline read {measured:.2f}x as fast with it"
        if measured is not None
        else f"not measured: modelled as {speedup:.0f}x"
    )
    gain = _input_gain(m, t_in=t_in / max(speedup, 1e-9))
    return Fix("input", action, gain, f"{what}; {how}", measured=measured)


def host_fixes(m: Measured) -> list[Fix]:
    """More steps per call: the step becomes s + o/n' with n' = `loop_size.choose(o, s)`."""
    o, s, n = m.call_overhead_s, cached_step_s(m) - parts(m)["host"], m.steps_per_loop
    best = loop_size.choose(o, s)
    if m.epoch_steps:
        best = min(best, m.epoch_steps)  # a call never runs past the epoch's end
    if best <= n:
        return []
    action = (
        'Trainer(..., steps_per_loop="auto")'
        if m.trainer
        else f"model.compile(..., steps_per_execution={best})"
    )
    return [
        Fix(
            "host",
            action,
            _gain(m, t_step=s + o / best),
            f"each call costs {o * 1e3:.2f} ms on the host for steps of {s * 1e3:.2f} ms; "
            f"{best} steps per call keep it under {loop_size.OVERHEAD_TARGET:.0%}",
            code=None if m.trainer else f"model.steps_per_execution = {best}",
        )
    ]


def accumulation_for(m: Measured) -> int:
    """The fewest batches per all-reduce that bring it under `COMMUNICATION_TARGET`."""
    p = parts(m)
    rest = p["compute"] + p["host"]
    ar = p["communication"]
    for k in range(2, MAX_ACCUMULATE + 1):
        if ar / k <= COMMUNICATION_TARGET * (rest + ar / k):
            return k
    return MAX_ACCUMULATE


def communication_fixes(m: Measured) -> list[Fix]:
    """Accumulation: one all-reduce per k batches, so a batch costs t - ar + ar / k."""
    if not m.all_reduce_s or m.all_reduce_s <= 0:
        return []
    k = accumulation_for(m)
    ar = parts(m)["communication"]
    gain = _gain(m, t_step=cached_step_s(m) - ar + ar / k)
    where = f"Trainer(..., accumulate_steps={k})" if m.trainer else _port(f"accumulate_steps={k}")
    return [
        Fix(
            "communication",
            where,
            gain,
            f"the all-reduce of {m.gradient_mb:.1f} MB of gradients takes {ar * 1e3:.1f} ms "
            f"a step; summed over {k} batches it runs once per {k} (effective batch "
            f"{k * m.batch}: scale the learning rate with tuning.scaled_learning_rate)",
            numerics=True,
            code=None if m.trainer else _port_code(f"accumulate_steps={k}"),
        ),
        Fix(
            "communication",
            f"a {k}x larger batch per replica with a scaled learning rate",
            gain,
            "the same all-reduce carries k times the examples (if memory allows)",
            numerics=True,
        ),
    ]


def _port(argument: str) -> str:
    """A Trainer argument, for a `model.fit` script: the one-line port, named as such."""
    return (
        f"tfaccel.Trainer(model, {argument}).fit(...) in place of model.fit(...) "
        "(a one-line port to the Trainer: it takes fit's arguments)"
    )


def _port_code(argument: str) -> str:
    return f"trainer = tfaccel.Trainer(model, {argument})"


def _policy_code(policy: str) -> str:
    return f'keras.mixed_precision.set_global_policy("{policy}")'


def _measured_compute_fix(m: Measured, action: str, speedup: float, why: str, **more) -> list[Fix]:
    """A fix whose compute part was measured `speedup` times faster: the step predicted
    with the compute part divided by it; listed by `worth_listing`."""
    compute = parts(m)["compute"]
    step = cached_step_s(m) - compute + compute / speedup
    fix = Fix("compute", action, _gain(m, t_step=step), why, measured=speedup, **more)
    return [fix] if worth_listing(fix) else []


def _xla_fix(m: Measured) -> list[Fix]:
    """XLA where `deep=True` measured it faster."""
    if m.xla_speedup is None or m.jit_compile:
        return []
    return _measured_compute_fix(
        m,
        "Trainer(..., jit_compile=True) (XLA)"
        if m.trainer
        else "model.compile(..., jit_compile=True) (XLA)",
        m.xla_speedup,
        f"measured (deep=True): the forward and backward passes ran {m.xla_speedup:.2f}x "
        "as fast compiled with XLA",
        code=None if m.trainer else "model.jit_compile = True",
    )


def _precision_fix(m: Measured) -> list[Fix]:
    """Another dtype policy where the doctor measured its passes faster."""
    found = m.precision_speedup()
    if found is None:
        return []
    policy, speedup = found
    checked = m.precision_outcome or {}
    checked = checked if checked.get("policy") == policy else {}
    return _measured_compute_fix(
        m,
        f'Trainer(..., precision="auto") (it measured {policy})'
        if m.trainer
        else f"{_policy_code(policy)} before the model is built",
        speedup,
        f"measured: the forward and backward passes ran {speedup:.2f}x as fast under "
        f"{policy} as under {m.dtype_policy}",
        numerics=True,
        code=None if m.trainer else _policy_code(policy),
        outcome=checked.get("reason"),
        adopted=checked.get("adopted"),
    )


def compute_fixes(m: Measured) -> list[Fix]:
    """Measured fixes (XLA, precision) first; "no software fix" only once both lost."""
    found = sorted(_xla_fix(m) + _precision_fix(m), key=lambda f: -(f.gain or 0.0))
    for f in _compute_fixes_unmeasured(m):
        if "jit_compile" in f.action and m.xla_speedup is not None:
            continue  # measured: listed above, or no gain
        if "precision" in f.action and m.precision_rates is not None:
            continue
        if not f.software and found:
            continue  # a measured fix gains: something does apply
        found.append(f)
    return found


def _compute_fixes_unmeasured(m: Measured) -> list[Fix]:
    fraction = compute_fraction_of_peak(m)
    if m.device == "CPU":
        if fraction is not None and fraction >= NEAR_PEAK:
            return [
                Fix(
                    "compute",
                    "none",
                    1.0,
                    f"at {fraction:.0%} of this machine's {m.matmul_peak_policy} matmul peak, "
                    "and no other precision measured faster: no software fix applies "
                    "(a faster device would)",
                    software=False,
                )
            ]
        known = "" if fraction is None else f" at {fraction:.0%} of the matmul peak"
        bound = None if fraction is None else min(1.0 / max(fraction, 1e-3), 10.0)
        compute = parts(m)["compute"]
        return [
            Fix(
                "compute",
                "a larger batch (tfaccel.tuning.find_batch_size measures examples/s per batch)",
                None
                if bound is None
                else _gain(m, t_step=cached_step_s(m) - compute * (1 - 1 / bound)),
                f"the step computes{known}; larger matrices run closer to the peak (the "
                "prediction is that bound)",
                condition="if a larger batch fits and trains as well (scale the learning rate)",
                numerics=True,
            )
        ]
    out = []
    if m.dtype_policy == "float32" and (m.gpu_capability or (0,))[0] >= 7:
        out.append(
            Fix(
                "compute",
                'Trainer(..., precision="auto") (mixed precision)'
                if m.trainer
                else f"{_policy_code('mixed_float16')} before the model is built",
                None,
                "this GPU has tensor cores that float32 does not use; not measured here",
                numerics=True,
                code=None if m.trainer else _policy_code("mixed_float16"),
            )
        )
    if not m.jit_compile:
        out.append(
            Fix(
                "compute",
                "Trainer(..., jit_compile=True) (XLA)"
                if m.trainer
                else "model.compile(..., jit_compile=True) (XLA)",
                None,
                "fuses element-wise ops; not measured here",
                code=None if m.trainer else "model.jit_compile = True",
            )
        )
    return out


def memory_fixes(m: Measured) -> list[Fix]:
    fraction = memory_fraction(m)
    if fraction is None or fraction < MEMORY_FULL:
        return []
    return [
        Fix(
            "memory",
            "Trainer(..., accumulate_steps=2) with half the batch"
            if m.trainer
            else _port("accumulate_steps=2") + " with half the batch",
            None,
            f"the peak is {fraction:.0%} of {m.memory.get('what')}: the same effective "
            "batch in two passes",
            code=None if m.trainer else _port_code("accumulate_steps=2"),
        ),
        Fix(
            "memory",
            "mixed precision or remat (tfaccel.blocks remat=True)"
            if m.trainer
            else f"{_policy_code('mixed_float16')} before the model is built, or remat "
            "(tfaccel.blocks remat=True)",
            None,
            "less activation memory",
            numerics=True,
        ),
    ]


def largest_batch(m: Measured) -> int | None:
    """The largest batch predicted to fit under `MEMORY_FULL` of the capacity: the
    memory above the variables' (model and optimizer) grows with the batch."""
    peak, capacity = m.memory.get("peak_mb"), m.memory.get("capacity_mb")
    fixed = m.memory.get("fixed_mb") or 0.0
    if not peak or not capacity or peak <= fixed or m.device != "GPU":
        return None
    per_example = (peak - fixed) / m.batch
    return max(int((MEMORY_FULL * capacity - fixed) / per_example), 0)


def fixes(m: Measured) -> list[Fix]:
    """Every stage's fixes in one order, by predicted time to accuracy
    (`Fix.time_to_accuracy`): the fixes that keep the path (the numerics, or a change the
    paired loss check found no worse) by predicted gain, then the numerics changes
    unchecked (their gain is in examples/s; the epochs may grow), then those that hold only
    under a condition; the verdict's stage breaks ties. The verdict's stage lists all its
    fixes, the others those `worth_listing`. A fix the check found worse ("faster steps,
    not adopted") comes last of all: it is never proposed first."""
    found = {
        "input": input_fixes(m),
        "host": host_fixes(m),
        "communication": communication_fixes(m),
        "compute": compute_fixes(m),
        "memory": memory_fixes(m),
    }
    first = verdict(m)
    own = [f for f in found.pop(first) if f.gain is None or not f.software or worth_listing(f)]
    others = [f for fs in found.values() for f in fs if worth_listing(f)]
    listed = sorted(own + others, key=lambda f: _rank(f, first))
    return [f for f in listed if f.adopted is not False] + [f for f in listed if f.adopted is False]


def _rank(fix: Fix, first: str) -> tuple:
    unchecked = fix.numerics and fix.time_to_accuracy() is None
    return (
        fix.adopted is False,
        fix.condition is not None,
        unchecked,
        -(fix.time_to_accuracy() or fix.gain or 0.0),
        fix.stage != first,
        fix.measured is None,
    )
