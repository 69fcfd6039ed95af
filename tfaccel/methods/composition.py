"""Composing methods: the rules, the "fast" stacks, and the plan they make.

`plan_for(methods, job)` resolves the methods (a list, "fast", "auto" or "none"; "auto"
probes candidate stacks on the job's data, `adaptive.auto`), checks every
one against the job (before step 1), applies them in a fixed order and returns a
`MethodPlan`; `tfaccel.methods.for_fit` (`fitting.py`) and the Trainer build on it.

Rules (`compose`): a method given twice keeps its first; one learning-rate schedule
(OneCycle or WarmupCosine); one batch mixing (MixUp or CutMix: both mix the same
pair of labels); EMA or layer freezing (Keras finalizes the averages over the trainable
variables, a set freezing changes); label smoothing with a mixing is applied once, by
the loss, to the mixed targets (never to the labels before mixing as well). `"fast"` is the stack
measured best for the job's kind (`FAST`, from `benchmarks/time_to_accuracy.py`; the kind
from `kinds.kind_of`); a method of it that does not fit the model (e.g. stochastic depth
without residual blocks) is dropped with the reason instead of failing.

Example:
    >>> plan = plan_for("fast", job)       # doctest: +SKIP
    >>> plan.describe()                    # doctest: +SKIP
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Iterable
from typing import Any

from tfaccel.callbacks._steps import user_stacklevel
from tfaccel.methods.adaptive import auto
from tfaccel.methods.adaptive.plateau import Plateau
from tfaccel.methods.averaging import EMA
from tfaccel.methods.base import Card, Job, Method, MethodPlan
from tfaccel.methods.batch_growth import ProgressiveBatch
from tfaccel.methods.depth import StochasticDepth
from tfaccel.methods.freezing import LayerFreezing
from tfaccel.methods.kinds import KINDS, attention_model, read_kind
from tfaccel.methods.label_methods import CutMix, LabelSmoothing, MixUp
from tfaccel.methods.resizing import ProgressiveResizing
from tfaccel.methods.schedules import OneCycle, WarmupCosine

# What a `methods=` argument may be: "fast", "auto", "none", None, a method or methods.
MethodsArg = str | Method | Iterable[Method] | None
# The order methods are applied in (maps are ordered by their own stage).
ORDER = (
    ProgressiveBatch,  # first: the schedules are sized to the steps its stages make
    OneCycle,
    WarmupCosine,
    Plateau,
    EMA,
    LabelSmoothing,
    MixUp,
    CutMix,
    ProgressiveResizing,
    LayerFreezing,
    StochasticDepth,
)
_GROUPS = (
    ((OneCycle, WarmupCosine, Plateau), "one learning-rate schedule at a time"),
    ((MixUp, CutMix), "one batch mixing at a time (both mix the same pairs of labels)"),
    (
        (EMA, LayerFreezing),
        "Keras' EMA copies its averages into every trainable variable when training ends, "
        "and freezing changes that set",
    ),
)


def _fast_image(job: Job | None = None) -> list[Method]:
    return [
        ProgressiveBatch(growth=8, stages=4, ramp_epochs=4),
        Plateau(scale=10.0),
        LabelSmoothing(0.1),
    ]


# A sequence or tabular job of at least this many optimizer steps an epoch (at its own
# batch) grows its batch, its schedule at 3x; a smaller one keeps its batch (a short table
# gets no method). Read from one epoch, never from the declared epochs (a generous
# declaration must not change the stack). Set by benchmarks/time_to_accuracy.py
# (benchmarks/results/time_to_accuracy.json: the long GRU's 625 and the table's 875 steps an
# epoch against the digits GRU's 40 and the breast-cancer table's 13; 200 leaves 25 steps
# an epoch at the 8x batch, where the digits GRU's 5 never reached its target).
LONG_EPOCH_STEPS = 200
"""Optimizer steps an epoch from which "fast" grows a sequence or tabular job's batch."""

_GROWN = {
    "sequence": "the batch grown 4x over the first 2 epochs, the schedule at 3x",
    "tabular": "the batch grown 8x over the first 8 epochs, the schedule at 3x",
}


def _long(job: Job | None) -> bool:
    return job is not None and job.steps_per_epoch >= LONG_EPOCH_STEPS


def _why_fast(kind: str, job: Job) -> str:
    """What "fast" chose from: the job's kind and, for sequences and tables, its length."""
    why = f"the stack measured best for {kind} jobs"
    if kind == "image":
        return why
    steps = f"{job.steps_per_epoch:,} steps an epoch"
    if _long(job):
        grown = _GROWN[kind]
        if kind == "sequence" and attention_model(job.model):
            grown += f"; attention: the warm-up over {ATTENTION_WARMUP:.0%} of the first epoch"
        return f"{why} of {LONG_EPOCH_STEPS:,} steps an epoch or more ({steps}): {grown}"
    if kind == "tabular":
        return (
            f"no method: none measured faster on tabular jobs under {LONG_EPOCH_STEPS:,} "
            f"steps an epoch ({steps}); the job trains as given"
        )
    return f"{why} under {LONG_EPOCH_STEPS:,} steps an epoch ({steps}): one batch"


# Chosen on the attention choice job (cifar_shaped_attention; attention_stacks.json).
ATTENTION_WARMUP = 0.25
"""The share of the first epoch over which "fast" warms an attention model's long job up."""


def _fast_sequence(job: Job | None = None) -> list[Method]:
    if not _long(job):
        return [Plateau(scale=10.0), LabelSmoothing(0.1)]
    attention = job is not None and attention_model(job.model)
    return [
        ProgressiveBatch(growth=4, stages=3, ramp_epochs=2),
        Plateau(scale=3.0, warmup=ATTENTION_WARMUP if attention else 1.0),
        LabelSmoothing(0.1),
    ]


def _fast_tabular(job: Job | None = None) -> list[Method]:
    if not _long(job):
        return []
    return [
        ProgressiveBatch(growth=8, stages=4, ramp_epochs=8),
        Plateau(scale=3.0),
        LabelSmoothing(0.1),
    ]


# What "fast" holds per job kind: the stack benchmarks/time_to_accuracy.py measured best
# by time to the plain Adam script's accuracy (benchmarks/results/time_to_accuracy.json;
# the figures are on `FAST_CARD` and the docs' method cards). Image: the batch grown 8x in
# 4 stages over the first 4 epochs (40 % of the choice jobs' 10) at the square-root rate,
# the rate warmed up over the first epoch to 10x then lowered when the validation loss
# stalls (`Plateau`, in place of the one-cycle sized to the declared epochs, for every kind:
# benchmarks/declared_length.py, benchmarks/results/declared_length.json), label smoothing.
# Sequence and tabular: by the job's steps an epoch (LONG_EPOCH_STEPS). Nothing reads the
# declared epochs: a generous declaration trains alike. The methods that slowed the
# jobs they ran on (MixUp, CutMix, progressive resizing, EMA, layer freezing) stay out.
FAST: dict[str, Callable[[Job | None], list[Method]]] = {
    "image": _fast_image,
    "sequence": _fast_sequence,
    "tabular": _fast_tabular,
}
"""Job kind -> a function of the `Job` (or None) returning the fresh methods of "fast"."""

FAST_CARD = Card(
    changes=(
        "what its stack changes, chosen by the job's kind and, for sequences and tables, its "
        "size (`LONG_EPOCH_STEPS`, 200 optimizer steps an epoch); nothing in it reads the "
        "declared epochs. Images: the batch grown 8× (32 → 256, the first three stages over "
        "the first 4 epochs) at the square-root rate, the rate warmed up over the first epoch "
        "to 10× the optimizer's and halved when the validation loss stalls an epoch "
        "(`Plateau`: no end date), label smoothing 0.1. Sequences: `Plateau` at 10× and label "
        "smoothing; from 200 steps an epoch the batch grown 4× over the first 2 epochs, "
        "`Plateau` at 3× (an attention model's warm-up over a quarter of the first epoch). "
        "Tables: no method; from 200 steps an epoch the batch grown 8× over "
        "the first 8 epochs, `Plateau` at 3×, label smoothing"
    ),
    helps=(
        "jobs whose path to the target a higher early rate shortens: on the four jobs of "
        "minutes 0.35× (CNN), 0.40× (GRU), 0.41× (table) and 0.52–0.65× (ResNet) the plain "
        "script's time to its accuracy, and a higher final accuracy on every job it changed; "
        "a generous declaration (150 epochs and `EarlyStopping`) trains as the exact one"
    ),
    hurts=(
        "the figures above were measured with a one-cycle in place of `Plateau` and the "
        "stages at a share of the declared epochs (the same stages at those jobs' length); "
        "jobs whose first epoch (tracing, the first validation) is most of their time gain "
        "less than their path; a Trainer with `accumulate_steps` or a dataset function on "
        "several replicas drops the progressive batch, saying so"
    ),
    measured=(
        "The image stack: on the CIFAR-shaped CNN the target came in two epochs on every "
        "seed, 0.36× the baseline, against three and 0.53× with the batch grown 4× over half "
        "the epochs. The length rule: at 10× the GRU of the CIFAR-shaped rows (6,250 steps) "
        "fell from 0.68 to 0.39 held-out accuracy as the rate peaked, on every seed (grown "
        "too, on the one seed tried), while the digits' GRU (800 steps) reached its target "
        "in a third of the epochs; grown, the digits' GRU never reached its target (1,257 "
        "examples make 5 steps an epoch at batch 256): the rule reads one epoch's steps (625 "
        "against 40), never the declared epochs. On the generated table's 28,000 "
        "training rows (17,500 steps) the growth 8× with the cycle at 3× reached the target "
        "in 0.44× the baseline's epochs (5 seeds), one-cycle alone in 0.69×. The sequence "
        "stack: after three epochs (batches 32, 64, 128) the GRU's held-out accuracy was "
        "0.796–0.803 on five seeds, where the table's stack had made 0.779–0.807 in three "
        "epochs two of which at batch 32 (the screen of 11 settings above). Short tables: on "
        "the breast-cancer MLP (390 steps) no method was faster: one-cycle 0.97× [0.87, "
        "1.05], 1.12× with 3× the epochs declared and a stop at the target; at 10× it "
        "overshot its target. MixUp, CutMix, progressive resizing, EMA and layer freezing "
        "slowed the jobs they ran on: they are not in it. Start-up: its batch maps are "
        "plain TensorFlow ops, traced without AutoGraph, whose conversion had been most of "
        "the map's trace (0.3 s of a CNN's first fit with `\"fast\"`; with the transformed "
        "dataset made once too, start-up 0.94 → 0.70 s, 0.47 s without methods). Any declared "
        "length (declared_length.json, a busy host: epochs to the target, medians): with the "
        "epochs declared 1×, 3× and 10× what the job needs and a stop at the target, the "
        "one-cycle took 3, 4 and 5 epochs on the digits CNN, 2, 4 and 4 on the CIFAR-shaped "
        "CNN, 5, 7 and 9 on the digits GRU; `Plateau` in its place 3, 3 and 3, 2, 2 and 2, "
        "3, 6 and 6: it replaced the one-cycle for images and sequences (its median time "
        "0.85×, 0.63× and 0.56× the one-cycle's at the same declaration on the CIFAR-shaped "
        "CNN, 3 seeds). On the generated table (875 steps an epoch, grown 8× over the first 8 "
        "epochs) the one-cycle took 7, 8 and 14 epochs, `Plateau` 7, 7 and 7 (each seed the "
        "same epochs at every declaration; its median time 0.79×, 0.80× and 0.79× the "
        "one-cycle's at 1×, where the one-cycle's was 0.86× at 3× and 1.25× at 10×; 3 seeds): "
        "it replaced the one-cycle for tables too. On the attention choice job (a transformer "
        "encoder over the CIFAR-shaped rows, 625 steps an epoch, 3 seeds, run interleaved) "
        "the sequence stack took 0.40× the plain script's time to its target, 0.29× with the "
        "warm-up over a quarter of the first epoch (first-epoch accuracy 0.731–0.740 against "
        "0.680–0.705; 4, 6, 4 epochs against 5, 6, 6); the rate's peak at 1× took 0.48× (one "
        "seed never), `Plateau` at 1× without the growth 0.79×, the growth alone never."
    ),
    defaults=(
        "each stack is the one `benchmarks/time_to_accuracy.py` measured best for its kind; "
        "`LONG_EPOCH_STEPS` between the short jobs' steps an epoch there (40, 13) and the long "
        "ones' (625, 875); the stages' epochs the share of those jobs' declared epochs the "
        "stacks were measured with (40 % of 10 and 20, 20 % of 10); `Plateau` from "
        "declared_length.json"
    ),
    measured_as='methods="fast"',
    contender="fast",
    results=("time_to_accuracy.json", "declared_length.json", "attention_stacks.json"),
)
"""The card of `methods="fast"`: its stacks, and what they measured."""


def resolve(methods: MethodsArg, kind: str | None = None, job: Job | None = None) -> list[Method]:
    """The methods a `methods=` argument names: a list of `Method`s, or "fast" / "auto" /
    "none" ("auto" names "fast"'s stack here: what it trains with when it declines to
    probe; `plan_for` probes).

    Args:
        methods: "fast", "auto", "none", None, a `Method`, or a list of them.
        kind: the job's kind for "fast" and "auto": "image", "sequence" or "tabular".
        job: the `Job`, for a "fast" stack that depends on its length (sequence, tabular).

    Raises:
        ValueError: an unknown name or kind (the message lists the valid ones).
        TypeError: an entry that is not a `tfaccel.methods` method.
    """
    if methods is None or methods == "none":
        return []
    if isinstance(methods, str):
        if methods not in ("fast", "auto"):
            raise ValueError(
                f"methods={methods!r}: use 'fast', 'none', 'auto' or a list of methods."
            )
        if kind not in FAST:
            raise ValueError(
                f"methods={methods!r} needs the job's kind, one of {KINDS}; got {kind!r}."
            )
        return FAST[kind](job)
    if isinstance(methods, type) and issubclass(methods, Method):
        raise TypeError(_a_class(methods, "is"))
    if isinstance(methods, Method):
        return [methods]
    try:
        items = list(methods)
    except TypeError:
        raise TypeError(
            f"methods={methods!r}: use 'fast', 'none', a method or a list of methods (e.g. "
            "[methods.LabelSmoothing(0.1), methods.EMA(0.99)]), or 'auto'."
        ) from None
    for item in items:
        if isinstance(item, type) and issubclass(item, Method):
            raise TypeError(_a_class(item, "holds"))
        if not isinstance(item, Method):
            raise TypeError(
                f"methods= holds {item!r}, not a tfaccel.methods method (e.g. "
                "methods.LabelSmoothing(0.1), methods.EMA(0.99))."
            )
    return items


def _a_class(cls: type, verb: str) -> str:
    name = cls.__name__
    return (
        f"methods= {verb} the class methods.{name}, not a method: write methods.{name}() "
        f"(with its arguments, e.g. methods.{name}(...)) to use it."
    )


def compose(methods: list[Method]) -> tuple[list[Method], list[tuple[str, str]]]:
    """Applies the composition rules: returns (methods in order, [(dropped, why)])."""
    kept: list[Method] = []
    dropped: list[tuple[str, str]] = []
    for method in methods:
        twin = next((m for m in kept if type(m) is type(method)), None)
        if twin is not None:
            dropped.append((method.name, f"given twice; the first ({twin!r}) is kept"))
            continue
        clash = next(
            (
                (m, why)
                for group, why in _GROUPS
                for m in kept
                if isinstance(m, group) and isinstance(method, group)
            ),
            None,
        )
        if clash is not None:
            dropped.append((method.name, f"{clash[1]}: {clash[0].name} is kept"))
            continue
        kept.append(method)
    kept.sort(key=lambda m: ORDER.index(type(m)) if type(m) in ORDER else len(ORDER))
    return kept, dropped


def plan_for(
    methods: MethodsArg,
    job: Job,
    *,
    kind: str | None = None,
    seed: int | None = None,
    data: Any = None,
) -> MethodPlan:
    """Resolves, composes, checks and applies `methods` to `job`; returns the `MethodPlan`
    (without a dataset: `for_fit` and the Trainer transform theirs with `plan.maps`).
    The kind for "fast" is `kind`, else read from the model, else the features' rank
    (`kinds.kind_of`).

    With "fast", a method whose check fails is dropped with its reason; a method the
    user named raises. With "auto", the stack is chosen by probes on `data` (the batched
    training `tf.data.Dataset`; `adaptive.auto`): without data, or on a job too short to
    pay for them, it declines to "fast"'s stack at once, saying why; the plan's `chosen`
    holds the comparison measured.

    Warns:
        UserWarning: for each method or schedule left out (the plan's `dropped`), why.
    """
    kind, note = read_kind(job.element_spec, job.model, kind)  # the model, else the rank
    seed = 0 if seed is None else int(seed)  # the batches' content varies the draws
    why, asked = None, methods
    if methods == "auto":
        choice = _auto(job, kind, seed, data)
        methods, why = choice.methods, choice.text + note
    fast = methods == "fast"
    chosen, dropped = compose(resolve(methods, kind, job))
    plan = MethodPlan(job)
    plan.dropped = dropped
    if fast:
        why = f"{why}: {_why_fast(kind, job)}" if why else _why_fast(kind, job) + note
    plan.chosen = why
    plan.chooser = "auto" if asked == "auto" else "fast"
    plan.seed = seed
    for method in chosen:
        try:
            method.check(plan.job)
        except (ValueError, TypeError) as error:
            if not fast:
                raise
            plan.dropped.append((method.name, f"does not fit this job: {error}"))
            continue
        method.apply(plan)
        plan.methods.append(method)
    for finish in plan.finishers:
        finish(plan)
    for name, why in plan.dropped:  # the settings table says it too, at INFO when verbose=0
        warnings.warn(f"tfaccel.methods: {name} dropped: {why}", stacklevel=user_stacklevel())
    return plan


def other_schedule(stack: list[Method]) -> tuple[str, list[Method]]:
    """`stack` with its one-cycle and `Plateau` swapped, each at its scale, and its name in
    "auto"'s table ("fast-plateau" or "fast-one-cycle")."""
    if any(isinstance(m, OneCycle) for m in stack):
        return "fast-plateau", [
            Plateau(scale=m.scale) if isinstance(m, OneCycle) else m for m in stack
        ]
    swapped = [OneCycle(scale=m.scale) if isinstance(m, Plateau) else m for m in stack]
    return "fast-one-cycle", swapped


def _auto(job: Job, kind: str, seed: int, data: Any) -> auto.AutoChoice:
    """The choice of `methods="auto"`: none, "fast", or "fast" with its other schedule."""
    if data is None:
        return auto.declined(job, "no training data was given to probe", "fast")
    name, _ = other_schedule(FAST[kind](job))
    candidates: auto.Candidates = {
        "none": lambda made: [],
        "fast": lambda made: "fast",
        name: lambda made: other_schedule(FAST[kind](made))[1],
    }
    return auto.choose(
        job,
        data,
        candidates,
        lambda argument, made: plan_for(argument, made, kind=kind, seed=seed),
        seed=seed,
    )
