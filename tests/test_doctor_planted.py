"""The doctor names four planted bottlenecks (benchmarks/doctor.py at toy sizes).

Verdicts only: timings on a shared 2-core machine are too noisy for gain asserts (the
benchmark measures the gains).
"""

from __future__ import annotations

import pathlib
import sys

import pytest

sys.path.insert(0, str(pathlib.Path(__file__).parents[1] / "benchmarks"))

import doctor as planted  # noqa: E402  (benchmarks/doctor.py)


@pytest.mark.parametrize("job", ["input", "host", "compute"])
def test_the_planted_limit_is_named(job):
    result = planted.run_job(job, toy=True, gain=False, budget_s=6, rounds=2)
    assert result["verdict"] == job, result["text"]
    if job == "compute":
        # Where the hardware offers a faster precision (bf16 units), measured as such,
        # it is the fix; otherwise nothing in software applies.
        found = result["precision_speedup"]
        if found and found[1] >= 1.05:
            assert "precision" in result["first_fix"], result["text"]
        else:
            assert result["no_software_fix"], result["text"]
    else:
        assert result["predicted_gain"] and result["predicted_gain"] >= 1.3, result["text"]


def test_two_one_core_workers_with_a_large_gradient_are_communication_bound():
    # Three rounds: one (budget 4 s) named the 2-core host's noise "compute" once in three runs.
    result = planted.communication(toy=True, gain=False, budget_s=6, rounds=3)
    assert result["verdict"] == "communication", result["text"]
    assert "accumulate_steps=" in result["first_fix"]
    assert "multi-worker" in result["text"]
