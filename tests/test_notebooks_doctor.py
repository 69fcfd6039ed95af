"""The doctor notebooks (07: four planted bottlenecks; 08: the tf.data service offload)
run top to bottom and show their outputs (`test_notebooks.run_top_to_bottom`); the other
notebooks run in tests/test_notebooks.py."""

import pytest
from test_notebooks import DOCTOR_NOTEBOOKS, IMAGES, run_top_to_bottom


def test_the_doctor_notebooks_are_notebooks():
    assert set(DOCTOR_NOTEBOOKS) <= set(IMAGES)


@pytest.mark.parametrize("name", DOCTOR_NOTEBOOKS)
def test_notebook_runs_top_to_bottom(name, monkeypatch, tmp_path, worker_zygote):
    run_top_to_bottom(name, monkeypatch, tmp_path, worker_zygote)
