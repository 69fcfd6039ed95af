"""The how-to pages on training run: every Python block of each page in order, in one
subprocess, printing what tests/test_docs.py's EXPECTED says (`test_docs.run_page`)."""

import pytest
from test_docs import run_page

PAGES = [
    "how-to/port-custom-loop.md",
    "how-to/port-model-fit.md",
    "how-to/precision.md",
    "how-to/resume.md",
    "how-to/train-to-accuracy.md",
]


@pytest.mark.parametrize("page", PAGES)
def test_page_python_blocks_run_in_order(page, tmp_path, jobs):
    run_page(page, tmp_path, jobs)
