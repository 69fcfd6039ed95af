"""`diagnose`: measure each stage of a training step, name the limit, rank the fixes."""

from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any

import keras
import tensorflow as tf

from tfaccel.callbacks import peak
from tfaccel.choices import policy as dtype_policies
from tfaccel.choices import timing, xla
from tfaccel.data.assembly.feed import Feed
from tfaccel.data.assembly.plan import graph_stages, missing
from tfaccel.data.iterators import adopt
from tfaccel.doctor import fix_rules, machine, measure, mfu, paired, variants
from tfaccel.doctor import verdict as rules
from tfaccel.doctor.phases import (
    MIN_WINDOW_S,
    compute_alone,
    input_alone,
    median_or,
    real_step,
    warm_up,
)
from tfaccel.doctor.report import Report
from tfaccel.doctor.snapshot import Snapshot
from tfaccel.train.setup import inputs
from tfaccel.train.step.losses import PerExampleLoss
from tfaccel.train.step.runner import Runner

if TYPE_CHECKING:
    from tfaccel.train.step.runner_interface import RunnerInterface
    from tfaccel.train.trainer import Trainer

DEFAULT_BUDGET_S = 60.0  # or EPOCH_SHARE of an epoch, whichever is larger
"""Seconds `diagnose` measures for by default (or `EPOCH_SHARE` of an epoch, if larger)."""
EPOCH_SHARE = 0.05
"""The share of an epoch `diagnose` may measure for by default, when over `DEFAULT_BUDGET_S`."""
ROUNDS = 3
MB = 1024.0 * 1024.0


def diagnose(
    target: Trainer | keras.Model,
    train_data: Any,
    *,
    budget_s: float | None = None,
    rounds: int = ROUNDS,
    deep: bool = False,
) -> Report:
    """Measures what limits training — input, compute, communication, host or memory.

    In this process, after a warm-up (tracing on a cached batch), within `budget_s`:

    - **compute alone**: the Trainer's own step loop (`runner.train`) on the first
      batch cached and repeated, in alternating rounds — calls of 1 step and of N steps
      give the per-call host overhead o and the step s (`T(n) = o + n·s`, the fastest
      call of each size);
    - **the real step**: the same loop on the real data at the job's steps per call,
      back to back in wall-time windows (the first drains what the buffers held), with
      its wait for input timed in the graph — the verdict's first evidence;
    - **input alone**: a fresh iterator over `train_data`, through the same
      distribution layer, read back to back in wall-time windows (its first batch, the
      start-up an epoch pays, reported apart); and the pipeline with each missing
      parallelism applied to its graph (`doctor.variants`), timed against itself;
    - **communication** (≥ 2 replicas): forward and backward passes with vs without the
      gradient all-reduce (`ReplicaContext.all_reduce`, as the optimizer calls it);
    - **memory**: the allocator's peak on a GPU (against its memory), the process's
      peak RSS on a CPU (against the host's RAM);
    - precision: the forward and backward passes under each dtype policy this hardware
      offers (`choices.policy.candidates`; none to time on a CPU without bf16 or fp16
      instructions), against the current one; a policy faster by 1.05x or more is then
      judged by outcome (`doctor.paired`): the paired loss check on the job's own model
      and first batches, whose verdict its fix states and is ranked by;
    - on a CPU, this machine's matmul peak (in the fastest precision) and the model's
      FLOPs, for the compute line;
    - with `deep=True`, XLA: the forward and backward passes on the cached batch with
      and without `jit_compile`, measured as `Trainer(jit_compile="auto")` measures them
      (copies of the model, alternating rounds), on any device.

    The rule that names the limit and the predictions of the fixes are in
    `tfaccel.doctor.verdict`. The model's weights, the optimizer's state and the
    Trainer's counters and metrics are saved before and restored after.

    Args:
        target: a `tfaccel.Trainer`, or a compiled `keras.Model` (its optimizer and loss
            run in the Trainer's step loop; its `steps_per_execution` is the steps per call).
        train_data: the training data as the Trainer takes it: a batched `tf.data.Dataset`
            or a dataset function / `tfaccel.data.pipeline(...)` result.
        budget_s: the time the diagnosis aims to stay under, tracing included (default: 60 s
            or 5 % of an epoch, whichever is larger); it sizes the timed windows.
        rounds: alternating rounds of measurements (the real step's median counts).
        deep: also measure XLA (a retrace of the passes; on top of the budget).

    Returns:
        A `Report`: `print(report)`, `report.plot(path)`, `report.to_dict()`.

    Raises:
        TypeError: `target` is neither a Trainer nor a keras.Model.
        ValueError: an uncompiled model, data the Trainer would refuse, a batch size
            that cannot be read, or a non-positive `budget_s` / `rounds`.
    """
    began = time.perf_counter()
    if budget_s is not None and not (
        isinstance(budget_s, (int, float)) and 0 < budget_s < float("inf")
    ):
        raise ValueError(
            f"budget_s must be a finite number of seconds > 0, got {budget_s!r}; pass e.g. "
            "budget_s=60 (or None for the default: 60 s or 5% of an epoch)."
        )
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}.")
    if not isinstance(deep, bool):
        raise ValueError(f"deep must be True or False, got {deep!r}.")
    job = _Job(target)
    feed = job.prepare(train_data)
    batch = feed.global_batch
    assert batch is not None  # prepare refuses data whose global batch it cannot read
    runner = job.runner
    state = Snapshot(runner.strategy, runner.state_variables())
    try:
        measured, notes, budget = _measure(job, feed, batch, began, budget_s, rounds)
        utilisation = mfu.measure(runner.model, feed.dataset.element_spec[0], measured)
        notes += _measure_precision(job, feed, measured)
        if deep:
            notes += _measure_xla(job, feed, measured)
    finally:
        with runner.restoring():
            state.restore()
    # From the job's own weights (restored): the check trains copies of the model.
    notes += paired.check_precision(runner, feed, measured)
    report = Report(
        verdict=rules.verdict(measured),
        measured=measured,
        fixes=fix_rules.fixes(measured),
        notes=notes,
        cost_s=time.perf_counter() - began,
        budget_s=budget,
        mfu=utilisation,
    )
    return report


class _Job:
    """The runner to drive and the job's settings, from a Trainer or a compiled model."""

    def __init__(self, target: Trainer | keras.Model) -> None:
        from tfaccel.train.trainer import Trainer

        self.trainer: Trainer | None
        self.runner: RunnerInterface
        self.setting: int | str  # the job's steps per loop: a number, or "auto"
        self.chosen: int | None  # the loop size chosen, None while "auto" has not chosen

        if isinstance(target, Trainer):
            self.trainer = target
            self.runner = target.runner
            self.setting = target.steps_per_loop
            self.chosen = target.loop_sizer.chosen
            return
        if not isinstance(target, keras.Model):
            raise TypeError(
                f"diagnose() takes a tfaccel.Trainer or a compiled keras.Model, got "
                f"{type(target).__name__}."
            )
        if getattr(target, "optimizer", None) is None or getattr(target, "loss", None) is None:
            raise ValueError(
                "The model is not compiled: call model.compile(optimizer=..., loss=...) "
                "first (the doctor runs its optimizer and loss), or pass a tfaccel.Trainer."
            )
        try:
            loss = PerExampleLoss(target.loss)
        except TypeError as error:
            raise ValueError(
                f"The doctor cannot run the model's loss {target.loss!r} ({error}); pass a "
                "tfaccel.Trainer built with one loss."
            ) from error
        self.trainer = None
        self.runner = Runner(
            target,
            optimizer=target.optimizer,
            loss=loss,
            metrics=[],
            strategy=target.distribute_strategy,
        )
        self.setting = int(getattr(target, "steps_per_execution", 1) or 1)
        self.chosen = self.setting

    def prepare(self, data: Any) -> Feed:
        """The data as one `Feed` (built once), checked as `fit` checks it; the step loops
        built for it."""
        if self.trainer is not None:
            feed = self.trainer.feed(data, steps=1)
        else:
            feed = Feed(data, self.runner.strategy)
            inputs.check_elements(feed.element_spec, self.runner.model)
            inputs.check_not_empty(feed, "training")
            self.runner.build(feed.dataset)
        if not feed.global_batch:
            raise ValueError(
                "The doctor cannot read the global batch size of the training data; batch "
                "it with a fixed size (dataset.batch(n)) or use tfaccel.data.pipeline(...)."
            )
        return feed


def _measure(
    job: _Job, feed: Feed, batch: int, began: float, budget_s: float | None, rounds: int
) -> tuple[rules.Measured, list[str], float]:
    p = warm_up(job, feed)
    runner, strategy, k = p.runner, p.strategy, p.runner.batches_per_step
    budget = budget_s or DEFAULT_BUDGET_S
    epoch = _epoch_steps(feed, k)
    if budget_s is None and epoch:
        budget = max(budget, EPOCH_SHARE * epoch * p.t1)
    p.left = max(budget - (time.perf_counter() - began), MIN_WINDOW_S * 8)
    c = compute_alone(p, rounds)
    real_s, steady, waits, n = real_step(p, c)
    startup_s, reads_s, plain_s, input_busy = input_alone(p, steady)
    sample, model = feed.dataset, runner.model
    input_s = statistics.median(reads_s) * k
    # Each epoch's fresh iterator pays its start-up (a shuffle buffer to fill, files to
    # open) beyond a batch: spread over the epoch's steps, the input and the real step
    # pay it too (a buffer as large as the data hides the whole epoch's input there).
    spread = 0.0
    if startup_s is not None and epoch:
        spread = max(startup_s - input_s / k, 0.0) / epoch
    measured = rules.Measured(
        batch=batch * k,
        replicas=int(strategy.num_replicas_in_sync),
        workers=int(getattr(strategy.extended, "_num_workers", 1) or 1),
        device="GPU" if p.gpus else "CPU",
        trainer=job.trainer is not None,
        steps_per_loop=n,
        steps_per_loop_setting=job.setting,
        accumulate_steps=k,
        step_s=c.step_s,
        call_overhead_s=c.overhead_s,
        input_s=input_s + spread,
        plain_input_s=None if plain_s is None else plain_s * k + spread,
        input_cores=input_busy.cores,
        trainer_cores=c.busy.cores,
        real_s=max(real_s, 1e-9) + spread,
        real_wait_s=statistics.median(waits) + spread if waits else None,
        all_reduce_s=c.all_reduce_s,
        gradient_mb=measure.gradient_bytes(model) / MB,
        cores=machine.cores(),
        pipeline=graph_stages(sample),
        memory=machine.memory(p.gpus, model, runner.optimizer),
        dtype_policy=model.dtype_policy.name,
        jit_compile=bool(runner.jit_compile),
        gpu_capability=machine.capability(p.gpus),
        input_startup_s=startup_s,
        startup_spread_s=spread,
        epoch_steps=epoch,
    )
    if c.matmul is not None:
        measured.flops_per_example = peak.training_flops_per_example(model, sample.element_spec[0])
        measured.matmul_peak = c.matmul.best
    if measured.real_wait_s is None:
        p.unmeasured.append("the real step's wait for input (not timed in this loop)")
    deadline = began + budget
    p.unmeasured += _measure_input_fixes(strategy, sample, measured, deadline, p.real1)
    measured.unmeasured = p.unmeasured
    return measured, _notes(measured, strategy, job), budget


def _measure_input_fixes(
    strategy: tf.distribute.Strategy,
    sample: tf.data.Dataset,
    measured: rules.Measured,
    deadline: float,
    batch_s: float,
) -> list[str]:
    """Times the pipeline with each missing parallelism applied (`variants`) against the
    pipeline as it is, read the same way (no distribution layer): sets
    `measured.input_speedups`; returns what could not be measured in time."""
    wanted = {key for key, _ in missing(measured.pipeline)} & {"parallel_map", "parallel_source"}
    if not wanted:
        return []
    shards = max(2 * measured.cores, 4)
    made = {}
    if "parallel_source" in wanted:
        made["parallel_source"] = variants.parallel_source(sample, shards)
    if "parallel_map" in wanted:
        made["parallel_map"] = variants.parallel_maps(sample)
    # One agreed window each: the pipeline as it is, then each variant.
    seconds = (deadline - time.perf_counter()) / (len(made) + 1) / 2
    seconds = measure.agree(strategy, max(seconds, 0.0))
    skipped = [
        f"the {key.replace('_', ' ')} fix (not rewritable)" for key, v in made.items() if v is None
    ]
    rewritten = {key: v for key, v in made.items() if v is not None}
    if seconds < max(MIN_WINDOW_S, 2 * batch_s):  # each read: a first batch and windows
        return skipped + [f"the {key.replace('_', ' ')} fix (no time left)" for key in rewritten]
    base = median_or(measure.read_windows(adopt(iter(sample.repeat())), seconds, 2)[1], None)
    speedups = {}
    for key, dataset in rewritten.items():
        after = measure.read_windows(adopt(iter(dataset.repeat())), seconds, 2)[1]
        if base and after:
            speedups[key] = base / statistics.median(after)
        else:
            skipped.append(f"the {key.replace('_', ' ')} fix (no batch within its window)")
    measured.input_speedups = speedups
    measured.source_shards = shards
    return skipped


OWN_STEP = (
    "the model runs its own train_step, which the probe's copies cannot time; to try a "
    "policy, call keras.mixed_precision.set_global_policy(...) before building the model, "
    "or compile it with jit_compile=True, and diagnose again"
)


def _measure_precision(job: _Job, feed: Feed, measured: rules.Measured) -> list[str]:
    """Sets `measured.precision_rates`: the passes under each policy this hardware offers
    (`choices.policy.candidates`), the current one first; and the matmul peak of the best."""
    policies, measured.precision_why = dtype_policies.candidates()
    current = measured.dtype_policy
    others = [p for p in policies if p != current]
    if not others:
        return []
    runner = job.runner
    if runner.loss is None:
        return [f"Precision: not measured ({OWN_STEP})"]
    try:
        timed = timing.time_policies(
            runner.model, runner.loss, runner.strategy, feed, [current, *others]
        )
    except ValueError as error:  # a model that cannot be copied under another policy
        return [f"Precision: not measured ({error})"]
    measured.precision_rates = timed["rates"]
    notes = [
        f"Precision: {c[0]} not timed further ({why})"
        for c, why in {**timed.get("dropped", {}), **timed.get("slow", {})}.items()
        if not c[1]
    ]
    if measured.matmul_peak is not None:
        for policy in others:
            dtype = keras.DTypePolicy(policy).compute_dtype
            best = peak.MatmulPeak(n=1024, dtype=dtype).measure(4)
            if best > measured.matmul_peak:
                measured.matmul_peak, measured.matmul_peak_policy = best, policy
    return notes


def _measure_xla(job: _Job, feed: Feed, measured: rules.Measured) -> list[str]:
    """Sets `measured.xla_speedup`: the passes with ÷ without jit_compile, timed as
    `Trainer(jit_compile="auto")` times them (`choices.xla.speedup`: copies of the
    model, one cached batch, alternating rounds)."""
    runner = job.runner
    if runner.loss is None:
        return [f"XLA (deep=True): not measured ({OWN_STEP})"]
    try:
        gain, why = xla.speedup(
            runner.model, runner.loss, runner.strategy, feed, measured.dtype_policy
        )
    except ValueError as error:  # a model that cannot be copied
        return [f"XLA (deep=True): not measured ({error})"]
    if gain is None:
        return [f"XLA (deep=True): the model's passes do not compile with XLA: {why}"]
    measured.xla_speedup = gain
    return []


def _epoch_steps(feed: Feed, accumulate: int) -> int | None:
    cardinality = feed.steps
    return cardinality // accumulate if cardinality > 0 else None


def _notes(m: rules.Measured, strategy: tf.distribute.Strategy, job: _Job) -> list[str]:
    notes = []
    if m.device == "CPU":
        notes.append(
            "input alone was measured with the cores free; in the real step the input "
            "pipeline and the step share this CPU's cores"
        )
    if job.trainer is None:
        notes.append(
            "a compiled model is measured in tfaccel's step loop (same optimizer and loss); "
            "model.fit's own per-call work (its callbacks, progress bar) adds to the host part"
        )
    if m.workers > 1:
        plain = "" if m.plain_input_s is None else f" against {m.plain_input_s * 1e3:.2f} ms"
        notes.append(
            f"multi-worker: {m.workers} workers ran every measurement in step (sizes agreed "
            "by an all-reduce); the rates are this worker's. The all-reduce was measured "
            "inside the step, with vs without it. A MultiWorkerMirroredStrategy step also "
            "pays fixed costs the all-reduce does not show — the distributed iterator (here "
            f"{m.input_s * 1e3:.2f} ms a batch{plain} for the plain dataset) and the "
            "collective runtime's threads; on a one-core worker they take CPU from the step "
            "and count as compute here. Fewer all-reduces (accumulate_steps) and larger "
            "batches per worker amortise both."
        )
    elif m.replicas > 1:
        notes.append(
            f"{m.replicas} replicas on this machine: the all-reduce was measured inside the "
            "step, with vs without it"
        )
    return notes
