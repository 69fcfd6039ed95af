"""The doctor's "offload to K tf.data service workers" (`tfaccel.doctor.service_fix`)."""

import pytest
from test_doctor import measured

from tfaccel.doctor import fix_rules, service_fix
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


def test_a_small_machine_is_told_the_cluster_it_needs_and_what_its_cores_reach():
    m = input_bound(cores=2)
    assert rules.verdict(m) == "input"
    cluster, here = service_fix.service_fixes(m)
    assert "offload to 4 tf.data service workers" in cluster.action
    assert "with a cluster" in cluster.condition
    after = rules.modelled_step_s(m, t_in=0.035 / 4, prefetch=True)
    assert after == pytest.approx(rules.cached_step_s(m))  # 4 workers: the trainer paces it
    assert cluster.gain == pytest.approx(rules.modelled_step_s(m) / after)
    # Cores unmeasured: one core an example's input while it runs, one its step: 2 cores
    # reach 2 / (1 / 1,829 + 1 / 6,394) = 2,845 examples/s, which 2 workers deliver.
    rate = 2 / (0.035 / 64 + rules.cached_step_s(m) / 64)
    assert service_fix.here_rate(m) == pytest.approx(rate)
    assert here.action == "data.pipeline(..., service=data.service.local(2))"
    assert "(4 would keep up)" in here.why and "proxy" in here.why
    assert "Python-bound" in here.condition
    assert here.gain == pytest.approx(
        rules.modelled_step_s(m) / rules.modelled_step_s(m, t_in=64 / rate, prefetch=True)
    )
    assert any(f.action == cluster.action for f in fix_rules.fixes(m))


def test_measured_cores_size_the_local_pool():
    # The input alone kept 1.0 core busy (one GIL), the step 0.5: an example costs
    # 1 / 1,829 + 0.5 / 6,394 core-seconds; 2 cores reach 3,201 examples/s: 2 workers.
    m = input_bound(cores=2, input_cores=1.0, trainer_cores=0.5)
    cost = 1.0 * 0.035 / 64 + 0.5 * rules.cached_step_s(m) / 64
    assert service_fix.cores_per_example(m) == pytest.approx(cost)
    assert service_fix.here_rate(m) == pytest.approx(2 / cost)
    assert service_fix.local_workers(m) == 2
    _, here = service_fix.service_fixes(m)
    assert "after the in-process fixes" in here.condition and "1.0 core(s) busy" in here.why


def test_a_pipeline_already_on_every_core_gains_nothing_from_local_workers():
    m = input_bound(cores=2, input_cores=2.0, trainer_cores=1.0)
    assert service_fix.here_rate(m) < 64 / 0.035  # slower than the pipeline in-process
    fixes = fix_rules.fixes(m)
    assert not any("local(" in f.action for f in fixes)
    assert any("offload to 4" in f.action for f in fixes)  # other machines' cores do help


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
