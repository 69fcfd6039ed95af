"""The doctor's "offload to K tf.data service workers", sized from two rates.

When the verdict is input, two rates size the offload:

- one worker's delivery rate `W`: the pipeline's rate in one process with the machine to
  itself (`Measured.plain_input_s`, else `input_s`) — a proxy for one service worker on
  a machine like this one, since starting a worker inside the doctor costs seconds of
  TensorFlow start-up per probe; the fix says it is a proxy;
- the trainer's consumption rate `C`: the step on cached data (`cached_step_s`).

`K = ceil(C / W)` workers feed the trainer; the predicted gain is the real step measured
÷ the step modelled with the input at `K·W` examples/s, prefetched here (as
`data.pipeline(..., service=...)` keeps the prefetch local). Workers on this machine share
its cores with the trainer: when `K` is more than it can spare (`cores - 1`, at least 1),
the fix names a cluster, and a second fix gives what `local(k)` could reach here.
"""

from __future__ import annotations

import math

from tfaccel.doctor.verdict import Fix, Measured, _input_gain, cached_step_s, verdict

MAX_WORKERS = 64
"""The most workers the doctor proposes (beyond, the input is not the fix)."""

__all__ = ["MAX_WORKERS", "rates", "service_fixes", "workers_needed"]


def rates(m: Measured) -> tuple[float, float]:
    """(one worker's delivery rate W, the trainer's consumption rate C), examples/s."""
    alone_s = m.plain_input_s or m.input_s
    worker = m.batch / alone_s if alone_s > 0 else math.inf
    trainer = m.batch / max(cached_step_s(m), 1e-12)
    return worker, trainer


def workers_needed(m: Measured) -> int:
    """The fewest workers whose deliveries keep up with the trainer (1..`MAX_WORKERS`)."""
    worker, trainer = rates(m)
    if not math.isfinite(worker) or worker <= 0:
        return 1
    return int(min(max(math.ceil(trainer / worker - 1e-9), 1), MAX_WORKERS))


def _offload_fix(m: Measured, k: int, action: str, where: str, condition=None) -> Fix:
    worker, trainer = rates(m)
    gain = _input_gain(m, t_in=m.batch / (k * worker), prefetch=True)
    why = (
        f"one worker delivers about {worker:,.0f} examples/s (proxy: this pipeline in one "
        f"process, measured alone) and the trainer consumes {trainer:,.0f} examples/s on "
        f"cached data: {k} worker(s) {where}"
    )
    return Fix("input", action, gain, why, condition=condition)


def service_fixes(m: Measured) -> list[Fix]:
    """ "Offload to K service workers", ranked with the other input fixes; [] unless the
    verdict is input or the pipeline already reads from a service."""
    if verdict(m) != "input" or any("DataService" in op for op, _ in m.pipeline):
        return []
    k = workers_needed(m)
    spare = max(m.cores - 1, 1)
    python_bound = (
        "if the pipeline is Python-bound (a worker process has its own GIL); TF ops "
        "already use every core in one process"
    )
    if k <= spare:
        action = f"data.pipeline(..., service=data.service.local({k}))"
        return [_offload_fix(m, k, action, "on this machine keep up with it", python_bound)]
    action = (
        f"offload to {k} tf.data service workers on other machines: data.pipeline(..., "
        "service='grpc://HOST:PORT') with `tfaccel data-service worker` on each"
    )
    cluster = _offload_fix(
        m,
        k,
        action,
        "keep up with it",
        condition=f"with a cluster: this machine's {m.cores} cores cannot host {k} more",
    )
    action = f"data.pipeline(..., service=data.service.local({spare}))"
    here = _offload_fix(
        m,
        spare,
        action,
        f"are what this machine can spare ({k} would keep up)",
        condition=python_bound,
    )
    return [cluster, here]
