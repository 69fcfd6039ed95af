"""The suite `tfaccel check` runs (`CHECKS`), one function each (see `tfaccel.check`).

Each takes the shared `Context` (a tiny job, its initial weights, the float32 reference)
and returns what it `Found`, raises `Skip` (the reason) or `CheckFailed` (what was found).
"""

from __future__ import annotations

import dataclasses
import os
import time
import warnings
from collections.abc import Callable
from typing import TYPE_CHECKING

from tfaccel.errors import CheckFailed, Skip

if TYPE_CHECKING:
    import keras
    import numpy as np
    import tensorflow as tf

    from tfaccel.train import Trainer

STEPS = 4  # training steps of every compared run
BATCH = 32  # global batch
MB = 1024 * 1024


@dataclasses.dataclass
class Found:
    """What a check that passed returns: on what it ran, what it found, its figure."""

    ran: str
    result: str
    figure: str = ""
    value: float | None = None


def configure() -> None:
    """Device settings the checks need; call before TensorFlow initialises.

    Memory growth on every GPU; with fewer than two GPUs, the CPU split into two logical
    devices so that a 2-replica `MirroredStrategy` runs. Raises `DeviceConfigError` when
    TensorFlow has already initialised with other settings.
    """
    from tfaccel import devices

    several = len(devices.list_gpus()) >= 2
    devices.configure(memory_growth=True, virtual_cpus=None if several else 2)


class Context:
    """What the checks share: the tiny job, its initial weights, the float32 reference."""

    def __init__(self):
        import keras
        import numpy as np
        import tensorflow as tf

        from tfaccel import devices

        self.gpus = devices.list_gpus()
        rng = np.random.default_rng(0)
        self.x = rng.random((STEPS * BATCH, 16), dtype=np.float32)
        self.y = (self.x[:, :4].argmax(axis=1)).astype("int32")
        keras.utils.set_random_seed(0)
        self.initial = self._model().get_weights()
        logical = tf.config.list_logical_devices("GPU")
        if len(logical) < 2:
            logical = tf.config.list_logical_devices("CPU")
        self.local_devices = [d.name for d in logical]
        self._reference = None
        # float32 matmuls in TensorFloat-32 (GPUs from compute capability 8.0, TensorFlow's
        # default) carry ~1e-3 relative error: compared runs get a looser tolerance.
        self.tf32 = bool(
            tf.config.experimental.tensor_float_32_execution_enabled()
            and any(g.compute_capability and g.compute_capability >= (8, 0) for g in self.gpus)
        )

    def tolerance(self, tight: float) -> float:
        """`tight` for float32 runs, or 1e-2 where float32 matmuls run in TensorFloat-32."""
        return max(tight, 1e-2) if self.tf32 else tight

    def tf32_note(self) -> str:
        """What the table says where TensorFloat-32 loosens the tolerance (else nothing)."""
        return " (TensorFloat-32 matmuls: tolerance 1e-2)" if self.tf32 else ""

    @staticmethod
    def _model():
        from tfaccel import models

        return models.mlp(input_shape=(16,), hidden=(32,), num_classes=4)

    def build(self) -> keras.Model:
        """The tiny model with the shared initial weights (a Trainer's model function)."""
        model = self._model()
        model.set_weights(self.initial)
        return model

    def data(self, x: np.ndarray | None = None) -> tf.data.Dataset:
        """The tiny job's batched dataset (`x`: other features, same labels)."""
        import tensorflow as tf

        x = self.x if x is None else x
        return tf.data.Dataset.from_tensor_slices((x, self.y)).batch(BATCH)

    def fit(
        self,
        *,
        strategy: tf.distribute.Strategy | None = None,
        precision: str | None = None,
        jit_compile: bool | str = False,
        x: np.ndarray | None = None,
        lr: float = 0.1,
    ) -> tuple[Trainer, float, list[np.ndarray]]:
        """(trainer, last loss, weights) after `STEPS` SGD steps of the tiny job."""
        import keras

        from tfaccel import devices
        from tfaccel.train import Trainer

        if strategy is None:
            strategy = devices.strategy("default")
        with warnings.catch_warnings():  # e.g. "mixed_float16 without tensor cores"
            warnings.simplefilter("ignore")
            trainer = Trainer(
                self.build,
                optimizer=lambda: keras.optimizers.SGD(lr),
                loss="sparse_categorical_crossentropy",
                strategy=strategy,
                steps_per_loop=STEPS,
                jit_compile=jit_compile,
                precision=precision,
            )
            history = trainer.fit(self.data(x), epochs=1, verbose=0)
        return trainer, history.history["loss"][-1], trainer.model.get_weights()

    def reference(self) -> tuple[float, list[np.ndarray]]:
        """(loss, weights) of the float32 run on the default device (made once)."""
        if self._reference is None:
            _, loss, weights = self.fit()
            self._reference = (loss, weights)
        return self._reference

    def one_of_local_devices(self) -> tf.distribute.Strategy | None:
        """One device of `local_devices`: the default strategy, or the first CPU where a
        single GPU left the mirrored run to the two logical CPUs."""
        from tfaccel import devices

        if self.gpus and "CPU" in self.local_devices[0].upper():
            return devices.strategy("one_device", devices=[self.local_devices[0]])
        return None  # the default strategy: GPU:0, or the CPU without GPUs

    def mirrored(self) -> tf.distribute.Strategy:
        """The `MirroredStrategy` over all local devices (one per process, shared)."""
        from tfaccel import devices

        return devices.strategy("mirrored", devices=self.local_devices)


def _weight_gap(weights, reference) -> float:
    """Largest |a - b| over all weights, relative to the largest reference weight."""
    import numpy as np

    scale = max(float(np.max(np.abs(w))) for w in reference) or 1.0
    gaps = [float(np.max(np.abs(a - b))) for a, b in zip(weights, reference, strict=True)]
    return max(gaps) / scale


def _loss_gap(loss: float, reference: float) -> float:
    return abs(loss - reference) / max(abs(reference), 1e-12)


def _devices_note(names: list[str]) -> str:
    return ", ".join(n.rpartition("device:")[2] for n in names)


# --- the checks -----------------------------------------------------------------------


def check_devices(ctx: Context) -> Found:
    from tfaccel import devices

    report = devices.describe()
    gpus = report["gpus"]
    logical = [d["name"] for d in report["logical_devices"]]
    ran = f"TensorFlow {report['tensorflow']}, CUDA build: {report['built_with_cuda']}"
    figure = f"{len(gpus)} GPU(s), {len(logical)} logical device(s)"
    if gpus:
        names = "; ".join(f"{g['name']} (cc {g['compute_capability']})" for g in gpus)
        return Found(ran, f"GPUs: {names}; logical: {_devices_note(logical)}", figure, len(gpus))
    reasons = " ".join(report["no_gpu_reasons"])
    if os.path.exists("/proc/driver/nvidia/version"):
        raise CheckFailed(
            f"an NVIDIA driver is loaded but TensorFlow sees no GPU: {reasons}", figure, 0
        )
    return Found(ran, f"no GPU ({reasons}); logical: {_devices_note(logical)}", figure, 0)


def check_memory_growth(ctx: Context) -> Found:
    import tensorflow as tf

    if not ctx.gpus:
        raise Skip("no GPU: memory growth applies to GPUs only")
    off = [g.name for g in ctx.gpus if not tf.config.experimental.get_memory_growth(g.physical)]
    if off:
        raise CheckFailed(f"memory growth is off on {off}")
    info = tf.config.experimental.get_memory_info("GPU:0")
    total = ctx.gpus[0].memory_mb
    used = info["current"] / MB
    return Found(
        f"{len(ctx.gpus)} GPU(s)",
        "on for every GPU (memory is taken as needed)",
        f"GPU:0 holds {used:,.0f} MiB of {total or '?'} MiB",
        used,
    )


def check_precision_choice(ctx: Context) -> Found:
    from tfaccel.choices import policy

    policies = policy.candidates()[0]
    choice = policy.choose()
    if len(policies) == 1:
        ran = "one candidate (float32): nothing to time"
    else:
        ran = f"timed {', '.join(policies)} on matmuls and a convolution"
    figure = ", ".join(f"{p} {r:.3g} {choice.unit}" for p, r in choice.rates.items())
    best = max(choice.rates.values()) / choice.rates["float32"] if choice.rates else 1.0
    return Found(ran, f"{choice.policy}: {choice.reason}", figure or "-", best)


def check_precision_step(ctx: Context) -> Found:
    loss32, _ = ctx.reference()
    trainer, loss, _ = ctx.fit(precision="auto")
    chosen = trainer.precision_choice.policy if trainer.precision_choice else "float32"
    steps = [(chosen, loss)]
    if chosen == "float32" and not ctx.gpus:  # the 16-bit path, even where it is not faster
        steps.append(("mixed_bfloat16", ctx.fit(precision="mixed_bfloat16")[1]))
    gaps = {policy: _loss_gap(value, loss32) for policy, value in steps}
    figure = ", ".join(f"{p} loss {v:.4f} (Δ {gaps[p]:.1e})" for p, v in steps)
    figure += f" vs float32 {loss32:.4f}"
    bad = [p for p, gap in gaps.items() if gap > (ctx.tolerance(1e-5) if p == "float32" else 0.05)]
    if bad:
        raise CheckFailed(f"loss under {bad} far from float32's", figure, max(gaps.values()))
    ran = f"Trainer(precision='auto') chose {chosen}; {STEPS} steps each" + ctx.tf32_note()
    return Found(ran, "loss within 5 % of float32's", figure, max(gaps.values()))


def check_loss_scaling(ctx: Context) -> Found:
    import keras
    import numpy as np

    from tfaccel.choices import policy

    fp16 = policy.candidates()[0]
    if "mixed_float16" in fp16:
        ran = "float16 hardware"
    elif ctx.gpus:
        raise Skip("this GPU has no float16 tensor cores (compute capability < 7.0)")
    else:
        ran = "no float16 instructions on this CPU: emulated float16, the same code path"
    # Inputs of 1e3: the forward pass stays finite in float16, the scaled gradients do not.
    trainer, _, before = ctx.fit(precision="mixed_float16", x=ctx.x * 1e3)
    optimizer = trainer.optimizer
    if not isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
        raise CheckFailed(f"the optimizer is {type(optimizer).__name__}, not a LossScaleOptimizer")
    scale = float(optimizer.dynamic_scale.numpy())
    initial = float(optimizer.initial_scale)
    changed = _weight_gap(before, ctx.initial)
    if changed != 0.0 or scale != initial / 2**STEPS:
        raise CheckFailed(
            f"overflowing steps were applied (weights moved by {changed:.1e}) or the scale "
            f"did not halve at each ({initial:g} -> {scale:g} after {STEPS} steps)",
            f"scale {initial:g} -> {scale:g}",
            scale,
        )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer.fit(ctx.data(), epochs=1, verbose=0)
    moved = _weight_gap(trainer.model.get_weights(), ctx.initial)
    if not np.isfinite(moved) or moved == 0.0:
        raise CheckFailed(f"a finite step after the overflow was not applied (moved {moved})")
    return Found(
        ran,
        f"{STEPS} overflowing steps skipped (weights unchanged, the scale halved at each), "
        "then finite steps applied",
        f"loss scale {initial:g} -> {scale:g}",
        scale,
    )


def check_xla(ctx: Context) -> Found:
    plain, loss32, weights32 = ctx.fit(jit_compile=False)
    _, loss, weights = ctx.fit(jit_compile=True)
    gap = _weight_gap(weights, weights32)
    figure = f"max |Δw| {gap:.1e}, loss {loss:.5f} vs {loss32:.5f}; {_xla_speed(plain, ctx)}"
    tolerance = ctx.tolerance(1e-4)
    if gap > tolerance or _loss_gap(loss, loss32) > tolerance:
        raise CheckFailed("the XLA-compiled step differs from the plain one", figure, gap)
    device = "GPU:0" if ctx.gpus else "CPU:0"
    ran = f"jit_compile=True on {device}" + ctx.tf32_note()
    return Found(ran, f"equal to the plain step (within {tolerance:g})", figure, gap)


def _xla_speed(trainer, ctx: Context) -> str:
    """XLA's speed on the tiny job's passes, timed as `Trainer(jit_compile="auto")` times it."""
    from tfaccel.choices import xla
    from tfaccel.data.assembly.feed import Feed

    policy = trainer.model.dtype_policy.name
    feed = Feed(ctx.data(None), trainer.strategy)
    gain, why = xla.speedup(trainer.model, trainer.loss, trainer.strategy, feed, policy)
    return why if gain is None else f"its passes {gain:.2f}x the plain ones' speed"


def check_mirrored(ctx: Context) -> Found:
    one = ctx.one_of_local_devices()
    if one is None:  # GPUs (TensorFloat-32 where they have it), or the CPU alone
        loss1, weights1 = ctx.reference()
        tolerance, note = ctx.tolerance(1e-5), ctx.tf32_note()
    else:  # one GPU: two logical CPUs against the first of them
        _, loss1, weights1 = ctx.fit(strategy=one)
        tolerance, note = 1e-5, " (one GPU: the CPU split in two, against CPU:0)"
    strategy = ctx.mirrored()
    _, loss, weights = ctx.fit(strategy=strategy)
    gap = _weight_gap(weights, weights1)
    figure = f"max |Δw| {gap:.1e}, loss {loss:.5f} vs {loss1:.5f}"
    if gap > tolerance or _loss_gap(loss, loss1) > tolerance:
        raise CheckFailed("the mirrored run differs from one device", figure, gap)
    ran = f"{strategy.num_replicas_in_sync} replicas: {_devices_note(ctx.local_devices)}" + note
    result = f"equal to one device on the same global batch (within {tolerance:g})"
    return Found(ran, result, figure, gap)


def check_all_reduce(ctx: Context) -> Found:
    import numpy as np
    import tensorflow as tf

    strategy = ctx.mirrored()
    n = strategy.num_replicas_in_sync
    size = 1024 * 1024  # floats: 4 MiB

    def replica():
        context = tf.distribute.get_replica_context()
        index = tf.cast(context.replica_id_in_sync_group, tf.float32)
        return context.all_reduce("sum", tf.fill([size], index + 1.0))

    step = tf.function(lambda: strategy.run(replica))
    values = [v.numpy() for v in strategy.experimental_local_results(step())]
    expected = n * (n + 1) / 2
    if not all(np.all(v == expected) for v in values):
        got = sorted({float(v[0]) for v in values})
        raise CheckFailed(f"sum over {n} replicas gave {got}, expected {expected:g}")
    times = []
    for _ in range(5):
        began = time.perf_counter()
        strategy.experimental_local_results(step())[0].numpy()
        times.append(time.perf_counter() - began)
    rate = 4 * size / MB / float(np.median(times))
    ops = type(getattr(strategy.extended, "_cross_device_ops", None)).__name__
    return Found(
        f"{n} replicas ({ops})",
        f"sum of replica ids + 1 = {expected:g} on every replica",
        f"4 MiB in {np.median(times) * 1e3:.1f} ms ({rate:,.0f} MiB/s)",
        rate,
    )


def check_device_memory(ctx: Context) -> Found:
    import psutil
    import tensorflow as tf

    if ctx.gpus:
        before = tf.config.experimental.get_memory_info("GPU:0")["current"]
        with tf.device("/GPU:0"):
            block = tf.ones([64, MB // 4], tf.float32)  # 64 MiB
        during = tf.config.experimental.get_memory_info("GPU:0")
        grew = (during["current"] - before) / MB
        del block
        figure = f"current {during['current'] / MB:,.0f} MiB, peak {during['peak'] / MB:,.0f} MiB"
        if grew < 60:
            raise CheckFailed(f"a 64 MiB tensor raised the reading by {grew:.1f} MiB", figure)
        return Found("GPU:0 allocator", "a 64 MiB tensor read as such", figure, grew)
    process = psutil.Process()
    rss = process.memory_info().rss / MB
    if not rss > 0:
        raise CheckFailed(f"the process RSS reads {rss}")
    total = psutil.virtual_memory().total / MB
    return Found(
        "no GPU: the process's RSS",
        "read",
        f"RSS {rss:,.0f} MiB of {total:,.0f} MiB RAM",
        rss,
    )


def check_doctor(ctx: Context) -> Found:
    import keras
    import tensorflow as tf

    from tfaccel import devices, doctor
    from tfaccel.train import Trainer

    def slow(x, y):  # a slow sequential map: 2 ms an example, one at a time
        x = tf.py_function(lambda a: (time.sleep(0.002), a)[1], [x], tf.float32)
        x.set_shape([16])
        return x, y

    x = tf.data.Dataset.from_tensor_slices((ctx.x, ctx.y)).repeat()
    data = x.map(slow).batch(BATCH, drop_remainder=True)
    trainer = Trainer(
        ctx.build,
        optimizer=lambda: keras.optimizers.SGD(0.1),
        loss="sparse_categorical_crossentropy",
        strategy=devices.strategy("default"),
        steps_per_loop=STEPS,
    )
    report = doctor.diagnose(trainer, data, budget_s=2, rounds=1)
    first = report.fixes[0].action if report.fixes else "none"
    if report.verdict != "input":
        raise CheckFailed(f"the doctor named {report.verdict!r}, not 'input'; first fix: {first}")
    figure = doctor_figure(report.rates())
    return Found(
        "a planted job: a sequential 2 ms map", f"verdict 'input'; first fix: {first}", figure
    )


def doctor_figure(rates: dict) -> str:
    """The input's rate against the measured step on cached data (compute, communication
    and host together), not a stage's ceiling, which is unbounded when it costs nothing
    measurable."""
    input_rate, step_rate = rates["ceiling_input"], rates["cached_step"]
    return (
        f"input {input_rate:,.0f} ex/s, the step on cached data {step_rate:,.0f} ex/s "
        f"({step_rate / input_rate:,.1f}x the input)"
    )


CHECKS: dict[str, Callable[[Context], Found]] = {
    "devices": check_devices,
    "memory growth": check_memory_growth,
    "precision choice": check_precision_choice,
    "precision step": check_precision_step,
    "float16 loss scaling": check_loss_scaling,
    "xla": check_xla,
    "mirrored": check_mirrored,
    "all-reduce": check_all_reduce,
    "device memory": check_device_memory,
    "doctor": check_doctor,
}
"""The checks `tfaccel check` runs, in order: the table's row name → the check."""
