"""One answer under noise (issue 67): throughput compared by interleaved readings until a
95 % interval separates the candidates or a budget ends; "no measurable difference"
keeps the simpler setting — in the precision and XLA choice and the batch finder."""

from __future__ import annotations

import itertools
import types

import keras
import numpy as np
import pytest
from test_batch_choice import SCE, StepClock

from tfaccel import tuning
from tfaccel.choices import readings, xla
from tfaccel.tuning.batch.report import BatchSizeReport, ProbeRow, knee_batch_size

F32, BF16 = "float32", "mixed_bfloat16"


def test_overlapping_readings_say_no_measurable_difference_and_keep_the_simpler():
    # bfloat16's best reading is 1.3x float32's, but round by round they cross
    found = readings.judge({F32: [100.0, 120.0, 95.0, 110.0], BF16: [130.0, 90.0, 105.0, 100.0]})
    assert found.chosen == F32 and not found.separated
    # geometric means 105.8 and 105.3; the paired log-ratios' interval, by hand: exp(0.0052
    # -+ 3.182 x 0.234 / 2) = 0.69-1.47x
    assert found.reason == (
        "no measurable difference between float32, mixed_bfloat16 (float32 1.01x "
        "mixed_bfloat16, 0.69-1.47x over 4 interleaved round(s), 95% interval): kept the "
        "simpler float32"
    )


def test_separated_readings_pick_the_faster():
    found = readings.judge({F32: [100.0, 110.0, 95.0], BF16: [205.0, 215.0, 190.0]})
    assert found.chosen == BF16 and found.separated
    assert found.reason.startswith("mixed_bfloat16 fastest: 2.00x float32 (1.89-2.12x over 3")
    # the paired log-ratios by hand: ln(2.05), ln(215/110), ln(2.0)
    low, high = readings.interval([0.7178, 0.6702, 0.6931])
    assert low > 0 and high < 0.8
    assert readings.t_quantile(2) == 4.303 and readings.interval([1.0]) == (
        -float("inf"),
        float("inf"),
    )


def test_the_fastest_of_three_must_beat_each_other_or_the_simplest_tied_is_kept():
    three = {16: [100.0, 101.0, 99.0], 32: [150.0, 149.0, 152.0], 64: [151.0, 150.0, 150.0]}
    found = readings.judge(three)
    assert found.chosen == 32 and not found.separated  # 64 not told apart from 32
    assert "no measurable difference between 32, 64" in found.reason


def fake_read(values: dict):
    """Readings served in order for each candidate, recording the order they are read in."""
    streams = {c: iter(v) for c, v in values.items()}
    order: list = []

    def read(candidate):
        order.append(candidate)
        return next(streams[candidate])

    return read, order


def test_compare_interleaves_and_stops_once_separated():
    read, order = fake_read({F32: [100.0] * 10, BF16: [200.0, 202.0, 199.0] + [200.0] * 7})
    found = readings.compare(read, [F32, BF16], min_rounds=3)
    assert found.chosen == BF16 and found.rounds == 3
    assert order == [F32, BF16, BF16, F32, F32, BF16]  # alternating: a drift touches both


def test_compare_reads_up_to_its_most_rounds_or_budget_then_keeps_the_simpler():
    read, order = fake_read(
        {F32: itertools.cycle([100.0, 120.0]), BF16: itertools.cycle([120.0, 100.0])}
    )
    found = readings.compare(read, [F32, BF16], min_rounds=2, max_rounds=6)
    assert found.rounds == 6 and found.chosen == F32 and not found.separated
    ticks = itertools.count()
    read, order = fake_read(
        {F32: itertools.cycle([100.0, 120.0]), BF16: itertools.cycle([120.0, 100.0])}
    )
    spent = readings.compare(read, [F32, BF16], min_rounds=2, budget_s=3, clock=lambda: next(ticks))
    assert spent.rounds < 6 and spent.chosen == F32
    # the workers settle together: one that wants to go on keeps every worker reading
    read, order = fake_read({F32: [100.0] * 4, BF16: [200.0] * 4})
    settled = readings.compare(read, [F32, BF16], min_rounds=2, settle=lambda stop: len(order) >= 8)
    assert settled.rounds == 4
    with pytest.raises(ValueError, match="two or more candidates"):
        readings.compare(read, [F32])
    with pytest.raises(ValueError, match="min_rounds <= max_rounds"):
        readings.compare(read, [F32, BF16], min_rounds=1)


def probe(rates, readings_, losses=None):
    return {
        "rates": rates,
        "readings": readings_,
        "losses": losses or dict.fromkeys(rates, 0.5),
        "dropped": {},
        "steps": 4,
        "rounds": 4,
        "seconds": 1.0,
    }


def test_xla_and_precision_keep_the_simpler_setting_when_the_readings_overlap():
    plain, jit = (F32, False), (F32, True)
    noisy = {plain: [100.0, 125.0, 95.0, 110.0], jit: [130.0, 96.0, 104.0, 100.0]}
    _, chosen = xla.decide(probe({plain: 110.0, jit: 130.0}, noisy), [F32], False)
    assert chosen.jit_compile is False  # best reading 1.18x, but the rounds cross
    assert chosen.reason.startswith("no measurable difference between float32, float32 + XLA")
    clear = {plain: [100.0, 101.0, 99.0], jit: [150.0, 152.0, 149.0]}
    _, chosen = xla.decide(probe({plain: 101.0, jit: 152.0}, clear), [F32], False)
    assert chosen.jit_compile is True
    both = {(F32, False): [100.0, 125.0, 95.0], (BF16, False): [130.0, 96.0, 104.0]}
    rates = {(F32, False): 125.0, (BF16, False): 130.0 * 1.2}
    picked = xla.policy_of(probe(rates, both), [F32, BF16], {}, "fake")
    assert picked.policy == F32 and "no measurable difference" in picked.reason


def report(**kwargs) -> BatchSizeReport:
    rows = [ProbeRow(16, True, 100.0, 10.0, "ok"), ProbeRow(32, True, 180.0, 12.0, "ok")]
    fields = dict(
        max_batch_size=32, best_batch_size=32, rows=rows, mode="power", knee=0.1,
        memory_budget_mb=None, memory_kind="host", probe_seconds=1.0,
    )  # fmt: skip
    return BatchSizeReport(**{**fields, **kwargs})


def test_recommend_never_gives_an_empty_reason_in_parentheses():
    grown = tuning.recommend(report(), batch_size=16, learning_rate=0.1, optimizer="sgd")
    assert grown.batch_size == 32 and "()" not in grown.reason
    assert grown.reason.startswith("batch 32, decided by the knee; warm the rate up")
    kept = tuning.recommend(
        report(best_batch_size=16), batch_size=16, learning_rate=0.1, optimizer="sgd"
    )
    assert kept.reason == "no larger batch pays: the knee allows 16; batch 16 kept"
    limited = tuning.recommend(
        report(limits={"memory": 32, "throughput knee": 32}),
        batch_size=16,
        learning_rate=0.1,
        optimizer="sgd",
    )
    assert "(memory ≤ 32 (largest that ran); throughput knee ≤ 32)" in limited.reason


def test_recommend_says_when_the_knee_was_not_told_apart_from_the_user_s_batch():
    said = "batch 32 against batch 16: no measurable difference between 16, 32 (...)"
    kept = tuning.recommend(
        report(best_batch_size=16, compared=said),
        batch_size=16,
        learning_rate=0.1,
        optimizer="sgd",
    )
    assert kept.kept and kept.reason.endswith(f"batch 16 kept ({said})")
    assert said in report(compared=said).table()


def test_recommend_says_when_the_search_did_not_read_the_knee_against_the_user_s_batch():
    grown = tuning.recommend(report(), batch_size=8, learning_rate=0.1, optimizer="sgd")
    assert grown.batch_size == 32
    assert (
        "read against batch 16, the search's first candidate, not your 8: "
        "BatchSearch(start=8) (as tune searches) compares it with yours under noise"
    ) in grown.reason


def test_a_tolerance_keeps_the_simplest_candidate_within_it():
    # 64 reads 1.03x below 128 every round: within a 5 % knee, and 32 is 2x slower
    steady = {32: [50.0, 51.0, 49.0], 64: [100.0, 101.0, 99.0], 128: [103.0, 104.0, 102.0]}
    found = readings.judge(steady, tolerance=0.05)
    assert found.chosen == 64 and found.separated
    assert found.reason.startswith("64 within 5% of the fastest, 128 (1.03x, 1.03-1.03x over 3")
    assert found.reason.endswith("every simpler one slower by more: kept the simpler 64")
    assert readings.judge(steady).chosen == 128  # no tolerance: any lead shown counts
    # the rounds cross: neither inside nor beyond the 5 %: the simpler, and it says so
    crossing = {64: [100.0, 80.0, 105.0], 128: [104.0, 110.0, 98.0]}
    found = readings.judge(crossing, tolerance=0.05)
    assert found.chosen == 64 and not found.separated
    assert found.reason.startswith("no measurable difference beyond 5% between 64, 128")
    with pytest.raises(ValueError, match=r"tolerance must be a fraction in \[0, 1\), got 1.0"):
        readings.judge(crossing, tolerance=1.0)
    with pytest.raises(ValueError, match="tolerance must be a fraction"):
        readings.compare(lambda c: 1.0, [64, 128], tolerance=-0.1)


def scripted(first: dict, rounds: list[dict]) -> list:
    """The probes' (batch, examples/s) in the order the search reads them: the candidates
    once each, then the knee's interleaved rounds (the second round largest first)."""
    order = [(b, r) for b, r in first.items()]
    for i, round_ in enumerate(rounds, start=1):
        sizes = sorted(round_, reverse=i % 2 == 1)
        order += [(b, round_[b]) for b in sizes]
    return order


X = np.random.default_rng(0).random((2048, 8)).astype("float32")
Y = (X.sum(axis=1) > 4).astype("int32")
SEARCH = dict(limit=64, mode="power", steps=2, noise_scale=False, min_steps_per_epoch=1)


def tiny():
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(2, activation="softmax")])


def searched(script, **kwargs):
    clock = StepClock(script, steps=2)
    search = tuning.BatchSearch(start=16, clock=clock, **SEARCH)
    report = tuning.find_batch_size(tiny, (X, Y), loss=SCE, search=search, **kwargs)
    assert clock.calls == len(clock.ticks)  # every scripted reading was taken
    return report


# Two runs of one job on a busy host: 32 and 64 truly within the 5 % knee, 16 half as fast.
# Alone, the first readings would choose 64 in run A (32 read low) and 32 in run B.
RUN_A = scripted(
    {16: 100.0, 32: 150.0, 64: 190.0},
    [{16: 101.0, 32: 180.0, 64: 186.0}, {16: 99.0, 32: 182.0, 64: 184.0}]
    + [{16: 100.0, 32: 181.0, 64: 185.0}, {16: 100.0, 32: 183.0, 64: 187.0}]
    + [{16: 100.0, 32: 182.0, 64: 186.0}, {16: 101.0, 32: 184.0, 64: 185.0}]
    + [{16: 100.0, 32: 181.0, 64: 187.0}],
)
RUN_B = scripted(
    {16: 100.0, 32: 185.0, 64: 170.0},
    [{16: 98.0, 32: 180.0, 64: 186.0}, {16: 100.0, 32: 181.0, 64: 185.0}]
    + [{16: 102.0, 32: 186.0, 64: 180.0}, {16: 100.0, 32: 182.0, 64: 184.0}]
    + [{16: 100.0, 32: 183.0, 64: 182.0}, {16: 99.0, 32: 181.0, 64: 185.0}]
    + [{16: 100.0, 32: 184.0, 64: 183.0}],
)


def test_the_same_search_twice_under_noise_gives_one_answer_or_says_it_cannot_tell():
    # the first readings alone (the knee before this issue) differ: 64, then 32
    for script, alone in ((RUN_A, 64), (RUN_B, 32)):
        rows = [ProbeRow(b, True, r, 1.0, "ok") for b, r in script[:3]]
        assert knee_batch_size(rows, 0.05) == alone
    answers = []
    for script in (RUN_A, RUN_B):
        report = searched(script)
        assert report.best_batch_size == 32 and report.limits["throughput knee"] == 32
        # 32 and 64 not told apart beyond the knee in 8 rounds (the most): the smaller, and why
        assert report.compared.startswith("batches 16, 32, 64 read again: no measurable")
        assert "beyond 5% between 32, 64" in report.compared
        assert report.compared.endswith("kept the simpler 32")
        choice = tuning.recommend(report, batch_size=16, learning_rate=0.1, optimizer="sgd")
        assert "()" not in choice.reason and "no measurable difference" in choice.reason
        answers.append((choice.batch_size, choice.learning_rate))
    assert answers[0] == answers[1] == (32, pytest.approx(0.2))


def test_tune_and_find_batch_size_with_recommend_give_one_batch(monkeypatch):
    from tfaccel.tuning import joint

    at = []
    found = types.SimpleNamespace(suggestion=None, reason="the range test's reason")
    monkeypatch.setattr(joint, "_range_test", lambda job, choice, *a: at.append(choice) or found)
    clock = StepClock(RUN_A, steps=2)
    search = tuning.BatchSearch(clock=clock, **SEARCH)  # tune starts it at the user's 16
    tuned = tuning.tune(
        tiny, (X, Y), loss=SCE, optimizer="sgd", batch_size=16, learning_rate=0.1,
        search=search, verbose=0,
    )  # fmt: skip
    assert clock.calls == len(clock.ticks)
    report = searched(RUN_A, optimizer="sgd")
    choice = tuning.recommend(report, batch_size=16, learning_rate=0.1, optimizer="sgd")
    assert (tuned.batch_size, tuned.learning_rate) == (choice.batch_size, choice.learning_rate)
    assert tuned.batch.reason == choice.reason and tuned.batch_report.compared == report.compared
    assert [c.batch_size for c in at] == [32]  # the rate is tested at the batch recommended
