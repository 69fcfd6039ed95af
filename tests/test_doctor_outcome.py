"""Judged by outcome (issue 67): the doctor runs the paired loss check of a faster precision
on the job's own model and batches, states its verdict on the fix and ranks by it — a fix
whose faster steps cost the loss is never proposed first."""

from __future__ import annotations

import dataclasses
import json

import keras
import numpy as np
import pytest
from test_doctor import measured, trainer_and_data

import tfaccel
from tfaccel.callbacks import peak
from tfaccel.choices import outcome, policy, timing, xla
from tfaccel.doctor import fix_rules

F32, BF16 = "float32", "mixed_bfloat16"


def _diagnosed(monkeypatch, bf16_losses):
    """The doctor on a compiled model (a `model.fit` script's), its bf16 passes faked 2x
    float32's and XLA's 1.3x; the paired check runs for real on the job's model and first
    batches, and `bf16_losses(losses)` replaces bf16's per-step losses."""
    monkeypatch.setattr(policy, "candidates", lambda *a: ([F32, BF16], "faked"))
    rates = {"rates": {F32: 100.0, BF16: 200.0}}
    monkeypatch.setattr(timing, "time_policies", lambda *a, **k: rates)
    monkeypatch.setattr(peak.MatmulPeak, "measure", lambda self, *a: 1.0)
    monkeypatch.setattr(xla, "speedup", lambda *a, **k: (1.3, "faked"))
    real, calls = outcome.paired_losses, []

    def paired(model, *args, steps, **kwargs):
        calls.append((model, steps))
        losses = real(model, *args, steps=steps, **kwargs)
        return {**losses, BF16: bf16_losses(losses)}

    monkeypatch.setattr(outcome, "paired_losses", paired)
    trainer, data = trainer_and_data()
    model = trainer.model
    model.compile(keras.optimizers.Adam(1e-2), "sparse_categorical_crossentropy")
    report = tfaccel.doctor.diagnose(model, data, budget_s=2, rounds=1, deep=True)
    assert [(m is model, steps) for m, steps in calls] == [(True, outcome.MIN_STEPS)]
    return report, (model, data)


def _expected_reason(losses: dict) -> str:
    """The loss after 8 steps of 32 examples: the means of the last half, by hand."""
    f32, bf16 = (np.mean(losses[p][-4:]) for p in (F32, BF16))
    return f"the loss after 256 examples was {bf16:.4g} vs {f32:.4g}"


def test_a_precision_that_doubles_the_loss_is_ranked_last_with_its_outcome(monkeypatch):
    seen = {}

    def doubled(losses):
        seen.update(losses, **{BF16: [2 * v for v in losses[F32]]})
        return seen[BF16]

    report, (model, data) = _diagnosed(monkeypatch, doubled)
    fix = report.fixes[-1]  # last of all: never proposed first
    assert "set_global_policy" in fix.action and fix.numerics and fix.adopted is False
    x, y = next(iter(data))  # the check's first loss: the job's model on its first batch
    first = keras.losses.sparse_categorical_crossentropy(y, model(x, training=True))
    assert seen[F32][0] == pytest.approx(float(np.mean(first)), rel=1e-5)
    assert fix.outcome.startswith(f"faster steps, not adopted: {_expected_reason(seen)}")
    assert fix.time_to_accuracy() == 0.0
    assert "faster steps, not adopted: the loss after 256 examples" in fix.line()
    assert "time to accuracy unchecked" not in fix.line()
    jit = next(i for i, f in enumerate(report.fixes) if "jit_compile" in f.action)
    assert jit < len(report.fixes) - 1 and not report.fixes[jit].numerics
    assert report.fixes[0].adopted is not False
    saved = json.loads(json.dumps(report.to_dict(), default=str))
    assert saved["measured"]["precision_outcome"]["adopted"] is False
    assert saved["fixes"][-1]["outcome"] == fix.outcome


def test_a_precision_with_an_equal_loss_keeps_its_place_by_gain(monkeypatch):
    seen = {}

    def equal(losses):
        seen.update(losses, **{BF16: list(losses[F32])})
        return seen[BF16]

    report, _ = _diagnosed(monkeypatch, equal)
    bf16 = next(i for i, f in enumerate(report.fixes) if "set_global_policy" in f.action)
    jit = next(i for i, f in enumerate(report.fixes) if "jit_compile" in f.action)
    fix = report.fixes[bf16]
    assert fix.adopted is True and fix.gain > report.fixes[jit].gain
    assert bf16 < jit  # time to accuracy: its 2x passes on the same path rank first
    assert fix.time_to_accuracy() == fix.gain
    assert f"{BF16} {_expected_reason(seen)}" in fix.outcome
    assert "within 2% or the noise" in fix.outcome
    assert "the paired loss check found the loss after the same examples no worse" in (fix.line())
    assert "examples/s" not in fix.line().split(":")[0]  # predicted as time to accuracy
    assert fix.code == f'keras.mixed_precision.set_global_policy("{BF16}")'


def test_a_check_that_cannot_run_leaves_the_fix_unchecked_and_says_why(monkeypatch):
    def fails(*args, **kwargs):
        raise ValueError("the optimizer Odd cannot be copied from its config (no)")

    monkeypatch.setattr(policy, "candidates", lambda *a: ([F32, BF16], "faked"))
    rates = {"rates": {F32: 100.0, BF16: 200.0}}
    monkeypatch.setattr(timing, "time_policies", lambda *a, **k: rates)
    monkeypatch.setattr(peak.MatmulPeak, "measure", lambda self, *a: 1.0)
    monkeypatch.setattr(outcome, "paired_losses", fails)
    trainer, data = trainer_and_data()
    report = tfaccel.doctor.diagnose(trainer, data, budget_s=2, rounds=1)
    fix = next(f for f in report.fixes if "precision" in f.action)
    assert fix.outcome is None and fix.adopted is None
    assert "time to accuracy unchecked" in fix.line()
    assert (
        "Precision: the paired loss check of mixed_bfloat16 did not run: the paired loss "
        "check could not run (the optimizer Odd cannot be copied from its config (no))"
    ) in report.notes


@pytest.mark.parametrize("adopted", [True, False, None])
def test_the_ranking_is_by_time_to_accuracy(adopted):
    """Arithmetic: bf16 2.4x and XLA 1.2x measured on a compute-bound step."""
    check = None
    if adopted is not None:
        reason = "the loss after 800 examples was 0.5 vs 0.5"
        reason = reason if adopted else f"{outcome.NOT_ADOPTED}: {reason}"
        check = {"policy": BF16, "adopted": adopted, "reason": reason}
    m = measured(
        precision_rates={F32: 100.0, BF16: 240.0},
        xla_speedup=1.2,
        step_s=0.2,
        precision_outcome=check,
    )
    listed = fix_rules.fixes(m)
    bf16 = next(i for i, f in enumerate(listed) if "precision" in f.action)
    jit = next(i for i, f in enumerate(listed) if "jit_compile" in f.action)
    assert (bf16 < jit) == bool(adopted)  # unchecked or worse: after XLA, which keeps the path
    assert (bf16 == len(listed) - 1) == (adopted is False)  # worse: last of all
    other = dict(check or {}, policy="mixed_float16")  # a check of another policy: not its
    m = dataclasses.replace(m, precision_outcome=other)
    fix = next(f for f in fix_rules.fixes(m) if "precision" in f.action)
    assert fix.outcome is None and "time to accuracy unchecked" in fix.line()


def test_a_measured_fix_of_another_stage_ranks_before_an_unchecked_batch():
    """A compute-bound model.fit script on CPU whose calls cost as much as its steps: the
    verdict's own fix (a larger batch, unchecked and conditional) is not proposed before
    the host's measured `steps_per_execution`, which keeps the path."""
    m = measured(
        trainer=False,
        steps_per_loop=1,
        step_s=0.010,
        call_overhead_s=0.008,
        epoch_steps=50,
        flops_per_example=1e4,  # 6 % of the matmul peak: a larger batch may run closer
    )
    listed = fix_rules.fixes(m)
    assert rules_verdict(m) == "compute"
    batch = next(i for i, f in enumerate(listed) if "larger batch" in f.action)
    host = next(i for i, f in enumerate(listed) if "steps_per_execution" in f.action)
    assert host < batch and listed[host].time_to_accuracy() > 1.0
    assert listed[host].code == "model.steps_per_execution = 50"  # never past the epoch


def rules_verdict(m) -> str:
    from tfaccel.doctor import verdict

    return verdict.verdict(m)
