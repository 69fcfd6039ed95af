"""The suggestion rule's two guards: a curve that barely falls, a divergence never seen."""

import json
import pathlib

import numpy as np
import pytest

from tfaccel.tuning.lr import rule as lr_rule

RATES = np.logspace(-6, 0, 100)
LOG = np.log10(RATES)
STORED = pathlib.Path(__file__).parents[1] / "benchmarks" / "results" / "learning_rate.json"


def falling():
    """Down from 2.3 to 0.5 around 1e-3, and still at 0.5 at the ramp's end."""
    return 0.5 + 1.8 / (1 + np.exp(2.5 * (LOG + 3.0)))


def diverging():
    """`falling`, exploding above 3e-2."""
    return falling() + np.where(LOG > -1.5, 4 * (np.exp(3 * (LOG + 1.5)) - 1), 0.0)


@pytest.mark.parametrize("seed", range(4))
def test_a_curve_that_barely_falls_through_noise_gives_none(seed):
    rng = np.random.default_rng(seed)
    curve = 2.0 + 0.3 / (1 + np.exp(2.5 * (LOG + 2.0))) + rng.normal(0, 0.06, RATES.size)
    curve[rng.choice(RATES.size, 3, replace=False)] += 3.0  # a few bad batches
    s = lr_rule.suggest(RATES, curve)
    assert s.rate is None and s.reason.startswith("barely learned"), s.reason
    assert "100 steps" in s.reason and "more steps or a larger batch" in s.reason


def test_a_negative_loss_skips_the_relative_floor():
    s = lr_rule.suggest(RATES, diverging() - 10.0)
    assert s.rate == pytest.approx(lr_rule.suggest(RATES, diverging()).rate)


@pytest.mark.parametrize("noise", [0.0, 0.05])
def test_a_divergence_never_seen_gives_a_third_of_the_descending_rate(noise):
    curve = falling() + np.random.default_rng(0).normal(0, noise, RATES.size)
    s = lr_rule.suggest(RATES, curve)
    assert s.rate is not None and "divergence is not seen" in s.reason, s.reason
    descending = s.rate * lr_rule.UNSEEN_BELOW
    assert np.isclose(RATES, descending).any()  # a rate of the ramp, / UNSEEN_BELOW
    assert f"{descending:.3g}" in s.reason
    assert 1e-3 <= descending <= s.minimum_rate


def test_a_clean_diverging_curve_keeps_its_suggestion():
    s = lr_rule.suggest(RATES, diverging())
    assert "divergence is not seen" not in s.reason
    # min(the largest clearly descending 0.0115, the minimum 0.0152 / 3), as before the guards
    assert s.rate == pytest.approx(0.0152 / lr_rule.BELOW_MINIMUM, rel=0.01)


def test_a_non_finite_loss_counts_as_the_divergence_seen():
    cut = np.r_[falling()[:95], [np.nan] * 5]
    s = lr_rule.suggest(RATES, cut)
    assert "divergence is not seen" not in s.reason
    unseen = lr_rule.suggest(RATES[:95], falling()[:95])
    assert "divergence is not seen" in unseen.reason
    assert s.rate == pytest.approx(unseen.rate * lr_rule.UNSEEN_BELOW)


def _stored():
    jobs = json.loads(STORED.read_text())["jobs"]
    out = {}
    for name, job in jobs.items():
        curve = job["range_test"]
        losses = [np.nan if v is None else v for v in curve["losses"]]
        out[name] = (curve["suggestion"], lr_rule.suggest(curve["rates"], losses))
    return out


def test_the_stored_benchmark_curves():
    read = _stored()
    assert read["cifar_cnn"][1].rate is None
    assert read["cifar_cnn"][1].reason.startswith("barely learned")
    house = read["house_mlp"][1]
    assert 0.002 <= house.rate <= 0.006 and "divergence is not seen" in house.reason
    for name in ("digits_mlp", "digits_resnet"):
        stored, now = read[name]
        assert now.rate == pytest.approx(stored, rel=0.1), name
        assert "divergence is not seen" not in now.reason
