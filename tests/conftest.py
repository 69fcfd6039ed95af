"""Splits the CPU into two logical devices before TensorFlow initialises.

Any test can then build a 2-replica `MirroredStrategy` on `/cpu:0` and `/cpu:1`.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import pytest  # noqa: E402

from tfaccel import devices  # noqa: E402

devices.configure(virtual_cpus=2)

CPUS = ["/cpu:0", "/cpu:1"]


@pytest.fixture
def mirrored():
    """A 2-replica MirroredStrategy over two logical CPUs."""
    return devices.strategy("mirrored", devices=CPUS)


def pytest_terminal_summary(terminalreporter):
    """One line on the iterator reaper over the whole run (issue: its backlog)."""
    from tfaccel.train.step import iterators

    s = iterators.stats()
    terminalreporter.write_line(
        f"iterator reaper: {s['adopted']} adopted, {s['freed']} freed, {s['pending']} pending "
        f"at the end, at most {s['most_pending']} pending at once, the longest deletion "
        f"{s['longest_free_s']:.2f} s"
    )
