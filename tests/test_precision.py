import warnings

import keras
import pytest

from tfaccel import precision
from tfaccel.devices import GPU


def gpu(capability, index=0):
    return GPU(index, f"fake{index}", capability, 16000, physical=None)


@pytest.mark.parametrize(
    "gpus, policy",
    [
        ([], "float32"),
        ([gpu((8, 0)), gpu((9, 0), 1)], "mixed_bfloat16"),
        ([gpu((8, 6)), gpu((7, 5), 1)], "mixed_float16"),
        ([gpu((7, 0))], "mixed_float16"),
        ([gpu((6, 1))], "float32"),
        ([gpu(None)], "float32"),
    ],
)
def test_choose_from_hardware(gpus, policy):
    choice = precision.choose(gpus, flags=())  # no GPU: a CPU without 16-bit instructions
    assert choice.policy == policy
    assert choice.reason


def test_choose_on_this_machine_picks_a_candidate():
    policies, why = precision.candidates()
    choice = precision.choose()
    assert choice.policy in policies and choice.reason
    if len(policies) == 1:  # nothing to measure: float32, for the hardware's reason
        assert choice.policy == "float32" and choice.reason == why and not choice.rates
    else:
        assert set(choice.rates) == set(policies)


def test_apply_and_scope_restore_previous_policy():
    before = keras.config.dtype_policy().name
    with precision.scope("mixed_bfloat16") as policy:
        assert policy.name == "mixed_bfloat16"
        assert keras.config.dtype_policy().compute_dtype == "bfloat16"
    assert keras.config.dtype_policy().name == before


def test_apply_auto_sets_the_chosen_policy():
    with precision.scope("auto") as policy:
        assert policy.name == precision.choose().policy


def test_unknown_policy_lists_valid_names():
    with pytest.raises(ValueError, match="mixed_bfloat16"):
        precision.apply("mixed_float8")


def test_float16_without_capable_gpu_warns_once(monkeypatch):
    monkeypatch.setattr(precision, "_warned_slow", False)
    with pytest.warns(UserWarning, match="much slower"):
        precision.resolve("mixed_float16", gpus=[])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        precision.resolve("mixed_float16", gpus=[])


def test_float16_on_tensor_core_gpu_does_not_warn(monkeypatch):
    monkeypatch.setattr(precision, "_warned_slow", False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert precision.resolve("mixed_float16", gpus=[gpu((7, 5))]) == "mixed_float16"


def test_wrap_optimizer_only_for_float16():
    sgd = keras.optimizers.SGD(0.1)
    assert precision.wrap_optimizer(sgd, "float32") is sgd
    assert precision.wrap_optimizer(sgd, "mixed_bfloat16") is sgd
    wrapped = precision.wrap_optimizer(sgd, "mixed_float16")
    assert isinstance(wrapped, keras.optimizers.LossScaleOptimizer)
    assert wrapped.inner_optimizer is sgd
    assert precision.wrap_optimizer(wrapped, "mixed_float16") is wrapped
