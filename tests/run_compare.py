"""Comparing a resumed training job's results with an uninterrupted one's
(`tests/scripts/train_job.py`: weights and counters in `.npz`, epochs in JSON lines)."""

import json

import numpy as np
import pytest


def history(tmp, name):
    """One entry per epoch (each worker logs every epoch: their lines must agree)."""
    by_epoch = {}
    for line in (tmp / f"{name}.jsonl").read_text().splitlines():
        logs = json.loads(line)
        by_epoch.setdefault(logs["epoch"], logs)
        assert by_epoch[logs["epoch"]] == logs, (by_epoch[logs["epoch"]], logs)
    return [by_epoch[epoch] for epoch in sorted(by_epoch)]


def assert_same_run(tmp, resumed, reference, suffix=".npz", reference_tmp=None):
    """Weights to 1e-5, every example once an epoch, and the same History (JSON lines)."""
    reference_tmp = reference_tmp or tmp
    got = dict(np.load(tmp / f"{resumed}{suffix}"))
    want = dict(np.load(reference_tmp / f"{reference}{suffix}"))
    for key in (k for k in want if k.startswith("arr_")):
        np.testing.assert_allclose(got[key], want[key], atol=1e-5)
    assert got["seen"] == want["seen"] == 2 * 96  # every example once an epoch
    assert got["id_sum"] == want["id_sum"]
    logged, uninterrupted = history(tmp, resumed), history(reference_tmp, reference)
    assert [h["epoch"] for h in logged] == [h["epoch"] for h in uninterrupted]
    for a, b in zip(logged, uninterrupted, strict=True):
        for key in ("loss", "accuracy"):
            assert a[key] == pytest.approx(b[key], abs=1e-5)
