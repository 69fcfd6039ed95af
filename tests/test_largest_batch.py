"""The largest batch that fits, as its own call, and untried rows marked (issue 41, Must 5)."""

import keras
import numpy as np
import pytest
from oom_layer import OOMAbove

from tfaccel import tuning
from tfaccel.tuning.batch.report import ProbeRow

SCE = "sparse_categorical_crossentropy"
X = np.random.default_rng(0).random((2048, 8)).astype("float32")
Y = (X.sum(axis=1) > 4).astype("int32")


def _model(threshold):
    def build():
        return keras.Sequential(
            [keras.Input((8,)), OOMAbove(threshold), keras.layers.Dense(2, activation="softmax")]
        )

    return build


def test_largest_batch_is_memorys_answer_not_the_knees():
    # find_batch_size would stop at 2048 / 20 steps an epoch = 102; memory allows 200
    assert tuning.largest_batch_size(_model(200), (X, Y), loss=SCE) == 200


def test_a_search_ended_by_the_data_warns_that_it_is_a_lower_bound():
    with pytest.warns(UserWarning, match=r"the data's 256 examples, not at memory"):
        assert tuning.largest_batch_size(_model(10_000), (X[:256], Y[:256]), loss=SCE) == 256


def test_untried_rows_say_untried():
    for reason in ("limit", "data", "steps per epoch", "time"):
        row = ProbeRow(512, False, None, None, reason)
        assert not row.tried and row.fits_text() == "untried"
    assert ProbeRow(64, False, None, None, "oom").fits_text() == "no"
    assert ProbeRow(8, True, 1.0, 1.0, "ok").fits_text() == "yes"
    report = tuning.find_batch_size(_model(10_000), (X, Y), loss=SCE, noise_scale=False)
    table = report.table()
    untried = [r for r in report.rows if not r.tried]
    assert untried and all(r.reason in ("steps per epoch", "data") for r in untried)
    assert "untried" in table
    line = next(
        li for li in table.splitlines() if li.strip().startswith(str(untried[0].batch_size))
    )
    assert " no " not in line
