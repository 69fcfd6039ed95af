"""The batch a search chooses: its limits, which decides, and the learning rate to train with."""

import json
import math

import keras
import numpy as np
import pytest
import tensorflow as tf

from tfaccel import tuning
from tfaccel.tuning.batch import budget, inputs, noise, noise_probe, time_to_accuracy
from tfaccel.tuning.batch.report import BatchSizeReport, ProbeRow

SCE = "sparse_categorical_crossentropy"


class StepClock:
    """A fake clock: every read advances by the current probe's batch over its rate.

    `rates`: {batch: examples/s}, or [(batch, examples/s), ...] for probes in that order
    (a batch timed twice appears twice); each probe reads the clock `steps` + 1 times.
    """

    def __init__(self, rates, steps: int):
        self.ticks = []
        for batch, rate in rates.items() if isinstance(rates, dict) else rates:
            self.ticks += [batch / rate] * (steps + 1)
        self.now, self.calls = 0.0, 0

    def __call__(self):
        self.now += self.ticks[self.calls]
        self.calls += 1
        return self.now


def linear_problem(noise: float, n: int = 20_000):
    """y = x·w* + noise; a model at fixed weights off the optimum; B_simple there, exactly."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(n, 4)).astype("float32")
    y = (x @ np.array([1.0, -2.0, 0.5, 3.0]) + noise * rng.normal(size=n)).astype("float32")
    w = np.array([[0.5], [-1.0], [0.0], [2.0]], dtype="float32")
    per_example = 2 * x * (x @ w - y[:, None])
    mean = per_example.mean(axis=0)
    exact = float(((per_example - mean) ** 2).sum(axis=1).mean()) / float(mean @ mean)

    def build():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, use_bias=False)])
        model.set_weights([w])
        return model

    return build, tf.data.Dataset.from_tensor_slices((x, y[:, None])), exact


def test_the_noise_scale_decides_when_it_is_the_smallest_limit():
    build, data, exact = linear_problem(noise=4.7)  # B_simple ≈ 40 at these weights
    rates = {8: 100.0, 16: 200.0, 32: 400.0, 64: 800.0, 128: 1600.0}  # no knee below 128
    report = tuning.find_batch_size(
        build,
        data,
        loss="mse",
        start=8,
        limit=128,
        mode="power",
        steps=2,
        optimizer=lambda: keras.optimizers.SGD(0.0),  # the probes keep the weights...
        noise_warmup=1_000,  # ...where the exact value is known (7 steps of 128)
        clock=StepClock(rates, steps=2),
        confirm=False,  # the clock scripts one reading a candidate
        job_examples=10**7,
    )
    assert report.max_batch_size == 128 and report.limits["throughput knee"] == 128
    # The note says how early in the job the noise scale was read.
    assert "warm-up of 896 examples (0.009 % of the job's 10,000,000)" in report.noise_scale_note
    assert report.noise_scale == pytest.approx(exact, rel=0.5)
    # The largest B_simple the estimate supports (two standard errors up), rounded down
    # to the granularity (8): smaller than the knee and memory.
    bound = noise.upper_limit(report.noise_scale, report.noise_scale_error)
    assert report.best_batch_size == int(bound) // 8 * 8 < 128
    assert report.decided_by == "noise scale"
    table = report.table()
    assert "noise scale B_simple ≈" in table and "decided by the noise scale" in table
    assert "memory ≤ 128" in table and "throughput knee ≤ 128" in table


def rows_at(rates: dict) -> list[ProbeRow]:
    return [ProbeRow(b, True, rate, 1.0, "ok") for b, rate in rates.items()]


def test_time_to_accuracy_weighs_examples_per_second_against_the_examples_needed():
    # (1 + B / B_simple) / (examples/s), by hand: 32 → 1.1328 / 3057, 128 → 1.5311 / 3934.
    assert time_to_accuracy.relative_time(32, 3057.0, 241.0) == pytest.approx(1.1328 / 3057, 1e-4)
    assert time_to_accuracy.relative_time(64, 2.0, math.inf) == 0.5  # unbounded: 1 / rate
    # The benchmark's small CNN: 1.29x the examples/s at 128 buys less than the 1.35x
    # examples it needs, so 32 reaches a loss soonest; the MLP's 1.43x at 64 pays.
    cnn = rows_at({32: 3057.0, 64: 3354.0, 128: 3934.0})
    assert time_to_accuracy.soonest_batch(cnn, 128, 241.0, 0.05) == 32
    mlp = rows_at({32: 6131.0, 64: 8779.0})
    assert time_to_accuracy.soonest_batch(mlp, 64, 107.0, 0.05) == 64
    # Without a noise bound it is the throughput knee among the batches allowed.
    assert time_to_accuracy.soonest_batch(cnn, 128, math.inf, 0.05) == 128
    # An untimed bound (48) gets the rate between 32 and 64 (log-log): 3057 · (3354/3057)^0.585.
    assert time_to_accuracy._interpolated({32: 3057.0, 64: 3354.0}, 48) == pytest.approx(
        3057 * (3354 / 3057) ** (math.log(1.5) / math.log(2))
    )
    assert time_to_accuracy.soonest_batch(cnn, 48, 1e9, 0.0) == 48  # faster than 32
    with pytest.raises(ValueError, match="b_simple must be > 0"):
        time_to_accuracy.soonest_batch(cnn, 128, 0.0, 0.05)


def test_time_to_accuracy_decides_when_examples_per_second_grow_too_slowly():
    build, data, _ = linear_problem(noise=4.7)  # B_simple ≈ 40 at these weights
    # The knee is 32 (within 5 % of 206/s) and B_simple allows ~40, but 32 needs
    # 1 + 32/40 = 1.8x the examples for 1.11x 16's examples/s: 16 reaches a loss sooner.
    rates = {8: 100.0, 16: 180.0, 32: 200.0, 64: 205.0, 128: 206.0}
    report = tuning.find_batch_size(
        build, data, loss="mse", start=8, limit=128, mode="power", steps=2,
        optimizer=lambda: keras.optimizers.SGD(0.0), noise_warmup=0,
        clock=StepClock(rates, steps=2), confirm=False,
    )  # fmt: skip
    assert report.limits["throughput knee"] == 32 and report.noise_scale > 32
    assert report.best_batch_size == 16 and report.decided_by == "time to accuracy"
    assert report.limits["time to accuracy"] == 16
    assert "time to accuracy ≤ 16" in report.table()
    choice = tuning.recommend(report, batch_size=8, learning_rate=1e-3, optimizer="adam")
    assert (choice.batch_size, choice.kept) == (16, False)
    assert "decided by the time to accuracy" in choice.reason
    # From the user's batch of 16 no larger batch pays: kept, and the reason says why.
    kept = tuning.recommend(report, batch_size=16, learning_rate=1e-3, optimizer="adam")
    assert kept.kept and "time to accuracy allows 16" in kept.reason


def test_memory_decides_when_examples_per_second_still_grow_at_the_largest_fit():
    x = np.random.default_rng(0).random((512, 8)).astype("float32")
    y = (x.sum(axis=1) > 4).astype("int32")

    def build():
        return keras.Sequential(
            [keras.Input((8,)), _FailAbove(64), keras.layers.Dense(2, activation="softmax")]
        )

    report = tuning.find_batch_size(
        build,
        (x, y),
        loss=SCE,
        start=16,
        mode="power",
        steps=2,
        noise_scale=False,
        min_steps_per_epoch=1,  # the data does not decide here
        clock=StepClock({16: 100.0, 32: 200.0, 64: 400.0}, steps=2),
    )
    assert [r.reason for r in report.rows] == ["ok", "ok", "ok", "oom"]
    assert report.capped_by == "memory" and report.best_batch_size == 64
    assert report.decided_by == "memory"
    assert "noise scale" not in report.limits


class _FailAbove(keras.layers.Layer):
    """Raises TensorFlow's out-of-memory error for a batch above `threshold`."""

    def __init__(self, threshold, **kwargs):
        super().__init__(**kwargs)
        self.threshold = threshold

    def call(self, x):
        def fail():
            failed = tf.numpy_function(_out_of_memory, [tf.shape(x)[0]], tf.float32)
            return x + tf.ensure_shape(failed, [])

        return tf.cond(tf.shape(x)[0] > self.threshold, fail, lambda: x)


def _out_of_memory(batch):
    if batch > 0:  # always: numpy_function needs a return value's type
        raise MemoryError(f"batch {batch} does not fit")
    return np.float32(0)


def test_the_noise_scale_is_skipped_when_the_time_is_spent():
    build, data, _ = linear_problem(noise=1.0, n=512)
    report = tuning.find_batch_size(build, data, loss="mse", start=16, steps=1, budget_s=0)
    assert report.noise_scale is None and "noise scale" in report.limits
    assert report.noise_scale_note.startswith("not measured")
    assert "noise scale not measured" in report.table()


def report_with(**fields) -> BatchSizeReport:
    rows = [
        ProbeRow(b, True, 100.0 * b**0.5, 10.0, "ok", seconds=1.0) for b in (8, 16, 32, 64, 128)
    ]
    values = {
        "max_batch_size": 128,
        "best_batch_size": 128,
        "rows": rows,
        "mode": "power",
        "knee": 0.05,
        "memory_budget_mb": 1000.0,
        "memory_kind": "host",
        "probe_seconds": 5.0,
        "examples": 50_000,
        "limits": {"memory": 128, "throughput knee": 128, "noise scale": 300.0},
    }
    values.update(fields)
    return BatchSizeReport(**values)


def test_the_rate_is_scaled_by_the_optimizers_rule_from_the_users_own():
    adam = tuning.recommend(report_with(), batch_size=32, learning_rate=1e-3, optimizer="adam")
    assert (adam.batch_size, adam.rule, adam.kept) == (128, "sqrt", False)
    assert adam.learning_rate == pytest.approx(2e-3)  # 1e-3 × √(128 / 32)
    sgd = tuning.recommend(
        report_with(), batch_size=32, learning_rate=0.1, optimizer=keras.optimizers.SGD(0.1)
    )
    assert (sgd.rule, sgd.learning_rate) == ("linear", pytest.approx(0.4))
    assert "LinearScalingWarmup" in sgd.reason
    fixed = tuning.recommend(
        report_with(), batch_size=32, learning_rate=0.1, optimizer="sgd", lr_scaling=None
    )
    assert fixed.learning_rate == 0.1 and fixed.batch_size == 128
    with pytest.raises(ValueError, match="base_learning_rate must be a number > 0"):
        tuning.recommend(report_with(), batch_size=32, learning_rate=0, optimizer="adam")


def test_a_grown_batch_under_the_square_root_rule_comes_with_its_one_cycle():
    from tfaccel import methods

    adam = tuning.recommend(report_with(), batch_size=32, learning_rate=1e-3, optimizer="adam")
    (cycle,) = adam.methods
    assert isinstance(cycle, methods.OneCycle) and cycle.peak == pytest.approx(3 * 2e-3)
    assert "train it with .methods: one-cycle peaking at 3x" in adam.reason
    # Through model.fit's helper at the tuned batch: the rate peaks at 3x the scaled rate
    # after 30 % of the job's steps (10 epochs of 50,000 / 128 = 390 steps) and decays.
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3)])
    data = tf.data.Dataset.from_tensor_slices(
        (np.zeros((128 * 390, 4), "float32"), np.zeros(128 * 390, "int32"))
    ).batch(128)
    plan = methods.for_fit(
        list(adam.methods),
        model,
        data,
        epochs=10,
        loss="sparse_categorical_crossentropy",
        optimizer=keras.optimizers.Adam(adam.learning_rate),
    )
    rate = cycle.schedule  # the Keras schedule the plan gave the optimizer
    assert float(plan.optimizer.learning_rate) == pytest.approx(float(rate(0)))
    assert float(rate(int(0.3 * 3900))) == pytest.approx(6e-3, rel=1e-3)
    assert float(rate(3899)) < 1e-5
    # SGD's linear rule warms up with its callback instead; unscaled and kept: nothing.
    sgd = tuning.recommend(report_with(), batch_size=32, learning_rate=0.1, optimizer="sgd")
    fixed = tuning.recommend(
        report_with(), batch_size=32, learning_rate=1e-3, optimizer="adam", lr_scaling=None
    )
    kept = tuning.recommend(
        report_with(best_batch_size=24, decided_by="noise scale"),
        batch_size=32,
        learning_rate=1e-3,
        optimizer="adam",
    )
    assert sgd.methods == fixed.methods == kept.methods == ()


def test_the_users_batch_and_rate_are_kept_when_no_larger_batch_pays():
    # The time ran out before any batch above the user's was timed: too small a job.
    rows = [ProbeRow(8, True, 100.0, 1.0, "ok"), ProbeRow(16, False, None, None, "time")]
    small = report_with(rows=rows, max_batch_size=8, best_batch_size=8, capped_by="time")
    kept = tuning.recommend(small, batch_size=64, learning_rate=2e-3, optimizer="adam")
    assert (kept.batch_size, kept.learning_rate, kept.kept) == (64, 2e-3, True)
    assert "too small for a probe to pay for itself" in kept.reason
    # The noise scale below the user's batch stops an increase, and lowers nothing.
    noisy = report_with(best_batch_size=24, decided_by="noise scale")
    kept = tuning.recommend(noisy, batch_size=32, learning_rate=1e-3, optimizer="adam")
    assert (kept.batch_size, kept.learning_rate, kept.kept) == (32, 1e-3, True)
    assert "noise scale allows 24" in kept.reason


def test_a_batch_with_too_few_steps_an_epoch_is_kept_not_lowered():
    # The steps-per-epoch rule stops an increase; lowering 64 to 60 for it alone measured
    # 1.05x the time to the same accuracy (digits), so the user's batch stays.
    report = report_with(examples=1_212, limits={"memory": 128, "steps per epoch": 60})
    choice = tuning.recommend(report, batch_size=64, learning_rate=2e-3, optimizer="adam")
    assert (choice.batch_size, choice.learning_rate, choice.kept) == (64, 2e-3, True)
    assert "no larger batch; kept" in choice.reason


def test_limits_survive_json_with_an_unbounded_noise_scale():
    report = report_with(noise_scale=math.inf, limits={"memory": 128, "noise scale": math.inf})
    text = json.dumps(report.to_dict(), allow_nan=False)
    back = BatchSizeReport.from_dict(json.loads(text))
    assert back.noise_scale == math.inf and back.limits["noise scale"] == math.inf
    assert "B_simple ≈ unbounded" in back.limits_line()


class FakeClock:
    """A clock set by hand (seconds)."""

    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_a_candidate_is_not_started_when_it_would_eat_the_reserve():
    clock = FakeClock()
    rows = [ProbeRow(8, True, 800.0, 1.0, "ok", seconds=0.5)]  # fixed cost ≈ 0.47 s
    limit = budget.TimeLimit(0.0, 10.0, None, clock=clock)
    clock.now = 6.0
    assert not limit.spent(rows, 16, steps=2)  # 6 s + ≈0.5 s of probe < 10 s
    assert limit.spent(rows, 16, steps=2, reserve=lambda seconds: 4.0)  # ... + 4 s kept
    assert not limit.spent(rows, 16, steps=2, reserve=lambda seconds: 3.0)


def test_the_limit_is_taken_as_it_will_stand_once_a_faster_batch_is_timed():
    clock = FakeClock()
    rows = [ProbeRow(8, True, 800.0, 1.0, "ok", seconds=0.5)]
    # 7.5 % (aimed under the 10 % promised) of 80,000 examples at 800/s: 7.5 s now; at
    # batch 32 up to 3,200/s: 1.9 s.
    assert budget.PROBE_AIM == pytest.approx(0.075) and budget.PROBE_SHARE == 0.1
    limit = budget.TimeLimit(0.0, None, 80_000, clock=clock)
    assert limit.seconds(rows) == pytest.approx(7.5)
    clock.now = 2.0
    assert not limit.spent(rows, 8, steps=2)
    assert limit.spent(rows, 32, steps=2)
    assert budget.fastest_after(rows, 32) == pytest.approx(3_200.0)
    assert budget.fastest_after(rows, 4) == pytest.approx(800.0)  # never below the fastest


def test_the_search_keeps_the_noise_scales_reserve_and_then_measures_it(monkeypatch):
    build, data, _ = linear_problem(noise=1.0, n=2_048)
    builds = []

    def counted():
        builds.append(1)
        return build()

    # Only candidates run without the noise scale: nothing reserved, none stopped for time.
    free = tuning.find_batch_size(
        counted, data, loss="mse", start=8, limit=64, mode="power", steps=1,
        budget_s=600, noise_scale=False,
    )  # fmt: skip
    assert [r.reason for r in free.rows] == ["ok"] * 4 + ["limit"]
    # A reserve as large as the budget from batch 32 on: 8 and 16 run, 32 may not start;
    # the noise scale then runs in the time kept, on the probes' model (no extra build).
    monkeypatch.setattr(
        noise_probe, "reserve", lambda search, batch, limit: limit if batch > 16 else 0.0
    )
    builds.clear()
    kept = tuning.find_batch_size(
        counted, data, loss="mse", start=8, limit=64, mode="power", steps=1, budget_s=600,
        confirm=False, clock=StepClock({8: 100.0, 16: 200.0}, steps=1),  # 16 is the knee
    )  # fmt: skip
    assert [(r.batch_size, r.reason) for r in kept.rows] == [(8, "ok"), (16, "ok"), (32, "time")]
    # Measured (inf is a measurement: after the warm-up the mean gradient can vanish in the noise).
    assert kept.noise_scale is not None and kept.noise_scale > 0
    assert kept.noise_scale_note.startswith("after a warm-up")
    assert len(builds) == 1
    # With the first candidate alone there is no increase to bound: nothing is measured.
    monkeypatch.setattr(noise_probe, "reserve", lambda search, batch, limit: limit)
    alone = tuning.find_batch_size(
        counted, data, loss="mse", start=8, limit=64, mode="power", steps=1, budget_s=600
    )
    assert [(r.batch_size, r.reason) for r in alone.rows] == [(8, "ok"), (16, "time")]
    assert alone.noise_scale is None and "nothing to bound" in alone.noise_scale_note


def test_the_probes_data_skip_tf_datas_default_rewrites():
    # Each rewrite re-serializes the in-memory arrays at every probe's iterator.
    dataset = inputs.without_rewrites(tf.data.Dataset.range(4))
    assert dataset.options().experimental_optimization.apply_default_optimizations is False
    assert list(dataset.batch(2).as_numpy_iterator())[1].tolist() == [2, 3]


def test_the_data_alone_decides_before_any_probe():
    # The `make run` job: 1,212 examples, batch 64 — 20 steps an epoch allow at most 60:
    # no larger batch, and the user's is kept (not lowered for the step count alone).
    choice = tuning.before_probing(
        batch_size=64, learning_rate=2e-3, optimizer="adam", examples=1_212
    )
    assert (choice.batch_size, choice.learning_rate, choice.kept) == (64, 2e-3, True)
    assert choice.reason.startswith("no probe: 1,212 examples leave no batch above 64")
    at_cap = tuning.before_probing(
        batch_size=60, learning_rate=2e-3, optimizer="adam", examples=1_212
    )
    assert (at_cap.batch_size, at_cap.learning_rate, at_cap.kept) == (60, 2e-3, True)
    tiny = tuning.before_probing(batch_size=32, learning_rate=0.1, optimizer="sgd", examples=10)
    assert (tiny.batch_size, tiny.kept) == (32, True)  # not lowered to nothing
    # Room above the user's batch: a probe can pay, nothing is decided here.
    assert (
        tuning.before_probing(batch_size=32, learning_rate=1e-3, optimizer="adam", examples=50_000)
        is None
    )
    with pytest.raises(ValueError, match="examples must be an integer >= 1"):
        tuning.before_probing(batch_size=32, learning_rate=1e-3, optimizer="adam", examples=0)


def test_the_next_rate_follows_the_growth_measured_so_far():
    one = [ProbeRow(32, True, 6_000.0, 1.0, "ok")]
    assert budget.fastest_after(one, 64) == pytest.approx(12_000.0)  # at most proportional
    # 32 → 64 grew 1.5× (not 2×): 128 is projected to grow 1.5× again.
    two = [*one, ProbeRow(64, True, 9_000.0, 1.0, "ok")]
    assert budget.fastest_after(two, 128) == pytest.approx(13_500.0)
    # A rate that fell is not projected to fall further; faster than measured, never slower.
    fell = [*one, ProbeRow(64, True, 5_000.0, 1.0, "ok")]
    assert budget.fastest_after(fell, 128) == pytest.approx(6_000.0)


def test_one_fast_reading_does_not_choose_the_batch():
    x = np.random.default_rng(0).random((256, 8)).astype("float32")
    y = (x.sum(axis=1) > 4).astype("int32")

    def build():
        return keras.Sequential([keras.Input((8,)), keras.layers.Dense(2, activation="softmax")])

    def search(readings, confirm=True):
        clock = StepClock(readings, steps=2)
        report = tuning.find_batch_size(
            build,
            (x, y),
            loss=SCE,
            start=16,
            limit=32,
            mode="power",
            steps=2,
            noise_scale=False,
            min_steps_per_epoch=1,
            confirm=confirm,
            clock=clock,
        )
        assert clock.calls == len(clock.ticks)  # every scripted reading was taken
        return report

    # 32 read 10 % faster than 16 once: alone, it would be the knee.
    assert search([(16, 100.0), (32, 110.0)], confirm=False).best_batch_size == 32
    # Read again in interleaved rounds (32 first, then 16; then 16, 32; ...): 32 at 90,
    # then 100 and 16 at 100 each time: no measurable difference, 16 stays (the simpler).
    again = [(32, 90.0), (16, 100.0), (16, 100.0), (32, 100.0)]
    again += [(32, 100.0), (16, 100.0), (16, 100.0), (32, 100.0)]
    again += [(32, 100.0), (16, 100.0), (16, 100.0), (32, 100.0), (32, 100.0), (16, 100.0)]
    # 8 rounds (the first readings and 7 more): the most
    report = search([(16, 100.0), (32, 110.0), *again])
    rates = {r.batch_size: r.examples_per_second for r in report.rows if r.fits}
    assert rates == pytest.approx({16: 100.0, 32: 100.0})
    assert report.best_batch_size == 16 and "no measurable difference" in report.compared
    # A real gain survives the readings: separated after the third round.
    report = search([(16, 100.0), (32, 150.0), (32, 140.0), (16, 105.0), (16, 100.0), (32, 145.0)])
    assert report.best_batch_size == 32
