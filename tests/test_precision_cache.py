"""The operations' rates are measured once per machine: a file cache keyed by what they
depend on, read by a new process, never by another machine, TensorFlow or probe."""

import json

import pytest
import tensorflow as tf

from tfaccel import precision
from tfaccel.choices import operations, policy

POLICIES = ("float32", "mixed_bfloat16")


@pytest.fixture
def probe(monkeypatch):
    """A counting stand-in for the measurement; each call a new process's (no memory)."""
    calls = []

    def op_rates(policies, budget_s=operations.BUDGET_S):
        calls.append(tuple(policies))
        return {p: 1e9 * (2.0 if "bfloat16" in p else 1.0) for p in policies}

    monkeypatch.setattr(operations, "op_rates", op_rates)
    monkeypatch.setattr(policy, "cpu_flags", lambda: frozenset({"avx512_bf16"}))
    operations._rates_for.cache_clear()
    yield calls
    operations._rates_for.cache_clear()


def new_process():
    operations._rates_for.cache_clear()


def cache_files(directory):
    return sorted(directory.glob("op_rates-*.json"))


def test_the_rates_are_written_and_a_new_process_reads_them(probe, probe_cache):
    first = precision.choose()
    assert probe == [POLICIES] and len(cache_files(probe_cache)) == 1
    assert "cache" not in first.reason and not first.source  # measured now
    new_process()
    second = precision.choose()
    assert probe == [POLICIES]  # not measured again
    assert second.policy == first.policy == "mixed_bfloat16" and second.rates == first.rates
    assert "read from the cache" in second.reason and "measured 2" in second.reason
    assert str(cache_files(probe_cache)[0]) in second.reason
    stored = json.loads(cache_files(probe_cache)[0].read_text())
    assert stored["key"]["tensorflow"] == tf.__version__ and stored["rates"] == first.rates


def test_the_cache_directory_is_the_environment_s_or_the_home_one(
    monkeypatch, tmp_path, probe_cache
):
    assert operations.cache_dir() == probe_cache  # the tests' own (conftest)
    monkeypatch.delenv(operations.CACHE_ENV)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert operations.cache_dir() == tmp_path / ".cache" / "tfaccel"


@pytest.mark.parametrize(
    "change",
    [
        lambda mp: mp.setattr(tf, "__version__", "0.0.1-another"),
        lambda mp: mp.setattr(policy, "machine", lambda: {"host": "another", "gpus": []}),
        lambda mp: mp.setattr(policy, "cpu_flags", lambda: frozenset({"amx_bf16"})),
        lambda mp: mp.setattr(operations, "VERSION", operations.VERSION + 1),
    ],
    ids=["tensorflow", "machine", "cpu_flags", "probe"],
)
def test_another_key_is_measured_again(probe, probe_cache, monkeypatch, change):
    precision.choose()
    new_process()
    change(monkeypatch)
    again = precision.choose()
    assert len(probe) == 2 and "cache" not in again.reason
    assert len(cache_files(probe_cache)) == 2  # each key its own file; the first kept


@pytest.mark.parametrize(
    "content",
    ["{not json", "", '{"rates": {"float32": 1}}', "[]", "null"],
    ids=["broken", "empty", "no-key", "list", "null"],
)
def test_a_corrupt_file_is_measured_again_and_rewritten(probe, probe_cache, content):
    precision.choose()
    (path,) = cache_files(probe_cache)
    path.write_text(content)
    new_process()
    again = precision.choose()
    assert len(probe) == 2 and again.policy == "mixed_bfloat16" and "cache" not in again.reason
    new_process()
    assert "read from the cache" in precision.choose().reason and len(probe) == 2


def test_a_file_whose_key_or_rates_do_not_match_is_not_read(probe, probe_cache):
    precision.choose()
    (path,) = cache_files(probe_cache)
    stored = json.loads(path.read_text())
    stored["key"]["tensorflow"] = "another"  # a file renamed from another key's
    path.write_text(json.dumps(stored))
    new_process()
    precision.choose()
    stored = json.loads(path.read_text())
    stored["rates"]["float32"] = -1.0
    path.write_text(json.dumps(stored))
    new_process()
    precision.choose()
    assert len(probe) == 3


def test_an_unwritable_cache_costs_a_measurement_not_an_error(probe, monkeypatch, tmp_path):
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setenv(operations.CACHE_ENV, str(blocked / "below"))
    assert precision.choose().policy == "mixed_bfloat16"
    new_process()
    precision.choose()
    assert len(probe) == 2 and blocked.read_text() == ""


def test_a_short_fit_s_choice_says_the_rates_came_from_the_cache(probe):

    precision.choose()
    new_process()
    choice = policy.by_operations("float32", "a job of 12 steps is too short")
    assert choice.policy == "float32" and "read from the cache" in choice.reason
    assert "the operations' pick mixed_bfloat16" in choice.reason  # named, not adopted
    assert len(probe) == 1
