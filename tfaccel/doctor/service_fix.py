"""The doctor's "offload to K tf.data service workers", sized from measured rates and cores.

When the verdict is input:

- one worker's delivery rate `W`: the pipeline's rate in one process with the machine to
  itself (`Measured.plain_input_s`, else `input_s`), as a worker process runs it (the fix
  says it is this proxy: starting a worker inside the doctor costs seconds of TensorFlow
  start-up per probe);
- the trainer's consumption rate `C`: the step on cached data (`cached_step_s`);
- what each costs in CPU: the cores the process kept busy while the input alone was read
  (`input_cores`, one GIL-bound pipeline: about one core) and while the step ran on
  cached data (`trainer_cores`).

Workers on other machines: `K = ceil(C / W)` feed the trainer. Workers on this machine
share its cores with the trainer, so at `R` examples/s they need `R · (input_cores / W +
trainer_cores / C)` cores: this machine reaches at most `R = cores ÷ (that cost per
example)`, however many workers (a pipeline of TF ops, already on every core, gains
nothing here: the fix is not offered). `k` local workers deliver `min(k·W, that)`; the
smallest `k` reaching it is offered, with the step modelled at that input rate
(prefetched here, as `data.pipeline(..., service=...)` keeps the prefetch local).
"""

from __future__ import annotations

import math

from tfaccel.doctor.verdict import Fix, Measured, _input_gain, cached_step_s, verdict

MAX_WORKERS = 64
"""The most workers the doctor proposes (beyond, the input is not the fix)."""

__all__ = [
    "MAX_WORKERS",
    "cores_per_example",
    "here_rate",
    "local_workers",
    "rates",
    "service_fixes",
    "workers_needed",
]


def rates(m: Measured) -> tuple[float, float]:
    """(one worker's delivery rate W, the trainer's consumption rate C), examples/s."""
    alone_s = m.plain_input_s or m.input_s
    worker = m.batch / alone_s if alone_s > 0 else math.inf
    trainer = m.batch / max(cached_step_s(m), 1e-12)
    return worker, trainer


def cores_per_example(m: Measured) -> float:
    """CPU seconds an example costs with the input on a worker: its input (a GIL-bound
    pipeline: one core while it runs) and its step on cached data."""
    worker, trainer = rates(m)
    input_cores = m.input_cores if m.input_cores else 1.0
    trainer_cores = m.trainer_cores if m.trainer_cores else 1.0
    return input_cores / worker + trainer_cores / trainer


def here_rate(m: Measured) -> float:
    """The most examples/s input on local workers can reach on this machine's cores."""
    worker, trainer = rates(m)
    return min(m.cores / cores_per_example(m), trainer)


def local_workers(m: Measured) -> int:
    """The fewest local workers that reach `here_rate` (at least 1)."""
    worker, _ = rates(m)
    return max(math.ceil(here_rate(m) / worker - 1e-9), 1)


def workers_needed(m: Measured) -> int:
    """The fewest workers whose deliveries keep up with the trainer (1..`MAX_WORKERS`)."""
    worker, trainer = rates(m)
    if not math.isfinite(worker) or worker <= 0:
        return 1
    return int(min(max(math.ceil(trainer / worker - 1e-9), 1), MAX_WORKERS))


def _offload_fix(
    m: Measured, rate: float, action: str, where: str, condition: str | None = None
) -> Fix:
    worker, trainer = rates(m)
    gain = _input_gain(m, t_in=m.batch / rate, prefetch=True)
    busy = "" if m.input_cores is None else f", {m.input_cores:.1f} core(s) busy"
    why = (
        f"one worker delivers about {worker:,.0f} examples/s (proxy: this pipeline in one "
        f"process, measured alone{busy}) and the trainer consumes {trainer:,.0f} examples/s "
        f"on cached data: {where}"
    )
    return Fix("input", action, gain, why, condition=condition)


def service_fixes(m: Measured) -> list[Fix]:
    """ "Offload to K service workers", ranked with the other input fixes; [] unless the
    verdict is input or the pipeline already reads from a service."""
    if verdict(m) != "input" or any("DataService" in op for op, _ in m.pipeline):
        return []
    worker, trainer = rates(m)
    k, here = workers_needed(m), local_workers(m)
    rate = here_rate(m)
    # Ranked after the in-process fixes (a service is more to run), and said when unsure.
    condition = (
        "after the in-process fixes above: workers add processes and a copy of every batch, "
        "and a generator source cannot be split among them"
    )
    if m.input_cores is None:
        condition = (
            "if the pipeline is Python-bound (a worker process has its own GIL); TF ops "
            "already use every core in one process"
        )
    shared = (
        f"{here} worker(s) here reach about {rate:,.0f} examples/s, all that {m.cores} "
        f"cores shared with the trainer allow"
    )
    local = f"data.pipeline(..., service=data.service.local({here}))"
    if rate >= trainer * (1 - 1e-9):
        return [_offload_fix(m, rate, local, f"{here} worker(s) here keep up", condition)]
    action = (
        f"offload to {k} tf.data service workers on other machines: data.pipeline(..., "
        "service='grpc://HOST:PORT') with `tfaccel data-service worker` on each"
    )
    keep_up = math.ceil(trainer / worker - 1e-9)
    cluster = _offload_fix(
        m,
        min(k * worker, trainer),
        action,
        f"{k} worker(s) keep up"
        if k == keep_up
        else f"{keep_up:,} would keep up; {k} (the most proposed) deliver {k * worker:,.0f}",
        condition=f"with a cluster: this machine's {m.cores} cores cannot host {k} more",
    )
    here_fix = _offload_fix(m, rate, local, f"{shared} ({keep_up:,} would keep up)", condition)
    return [cluster, here_fix]
