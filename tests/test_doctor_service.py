"""The doctor's "offload to K tf.data service workers" (`tfaccel.doctor.service_fix`)."""

import pytest
from test_doctor import measured

from tfaccel.doctor import service_fix
from tfaccel.doctor import verdict as rules

PIPELINE = [("TensorSlice", None), ("ParallelMap", -1), ("Batch", None), ("Prefetch", None)]


def input_bound(**changes):
    # one process delivers 64 / 0.035 = 1,829 examples/s; the trainer takes 64 / 0.01001
    base = dict(input_s=0.035, real_s=0.035, real_wait_s=0.025, pipeline=PIPELINE)
    return measured(**{**base, **changes})


def test_the_rates_size_the_pool():
    m = input_bound()
    worker, trainer = service_fix.rates(m)
    assert worker == pytest.approx(64 / 0.035)
    assert trainer == pytest.approx(64 / rules.cached_step_s(m))
    assert service_fix.workers_needed(m) == 4  # ceil(6,394 / 1,829)
    assert service_fix.workers_needed(input_bound(plain_input_s=0.007)) == 1


def test_a_small_machine_is_told_the_cluster_it_needs():
    m = input_bound(cores=2)
    assert rules.verdict(m) == "input"
    cluster, here = service_fix.service_fixes(m)
    assert "offload to 4 tf.data service workers" in cluster.action
    assert "with a cluster" in cluster.condition
    after = rules.modelled_step_s(m, t_in=0.035 / 4, prefetch=True)
    assert after == pytest.approx(rules.cached_step_s(m))  # 4 workers: the trainer paces it
    assert cluster.gain == pytest.approx(rules.modelled_step_s(m) / after)
    assert here.action == "data.pipeline(..., service=data.service.local(1))"
    assert "(4 would keep up)" in here.why and "proxy" in here.why
    assert any(f.action == cluster.action for f in rules.fixes(m))


def test_a_large_machine_is_told_local_workers():
    m = input_bound(cores=16)
    (fix,) = service_fix.service_fixes(m)
    assert fix.action == "data.pipeline(..., service=data.service.local(4))"
    assert fix.gain == pytest.approx(rules.modelled_step_s(m) / rules.cached_step_s(m))
    assert "Python-bound" in fix.condition


def test_no_offload_unless_input_bound_or_already_offloaded():
    assert service_fix.service_fixes(measured()) == []  # compute-bound
    served = PIPELINE[:-1] + [("DataServiceDatasetV4", None), ("Prefetch", None)]
    assert service_fix.service_fixes(input_bound(pipeline=served)) == []
