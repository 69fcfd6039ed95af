"""`tfaccel.train.state.policies`: Checkpointing and FaultPolicy check their values when made,
with the messages `Trainer.fit` gives."""

import dataclasses
import pathlib
import re

import pytest

from tfaccel.train.state.policies import RESUME_MODES, Checkpointing, FaultPolicy


def test_defaults_are_fits():
    assert Checkpointing(None) == Checkpointing(None, every="epoch", keep=3, resume="auto")
    assert not Checkpointing(None).enabled
    assert FaultPolicy() == FaultPolicy(3, False, True)


def test_a_directory_is_kept_as_a_string():
    policy = Checkpointing(pathlib.Path("runs") / "a", every=5, keep=1, resume="never")
    assert policy.directory == "runs/a" and policy.enabled
    assert (policy.every, policy.keep, policy.resume) == (5, 1, "never")


def test_they_are_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        Checkpointing("ckpt").keep = 5
    with pytest.raises(dataclasses.FrozenInstanceError):
        FaultPolicy().divergence_loops = 5


@pytest.mark.parametrize("every", [0, -1, 1.5, "1", True, None, "step"])
def test_a_bad_every(every):
    message = f"checkpoint_every must be 'epoch' or an integer >= 1 step, got {every!r}."
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        Checkpointing("ckpt", every=every)
    with pytest.raises(ValueError, match="checkpoint_every must be"):
        Checkpointing(None, every=every)  # checked without a directory too, as fit does


@pytest.mark.parametrize("resume", ["yes", "", None, "AUTO", ["auto"]])
def test_a_bad_resume(resume):
    with pytest.raises(ValueError, match=r"resume must be one of \('auto', 'force', 'never'\)"):
        Checkpointing("ckpt", resume=resume)
    with pytest.raises(ValueError, match="resume must be one of"):
        Checkpointing(None, resume=resume)


@pytest.mark.parametrize("keep", [0, -2, 1.0, "3", True, None])
def test_a_bad_keep(keep):
    with pytest.raises(ValueError, match=f"keep must be an integer >= 1, got {keep!r}"):
        Checkpointing("ckpt", keep=keep)


def test_keep_is_not_checked_without_a_directory():
    assert Checkpointing(None, keep=0).keep == 0  # fit ignores keep without checkpoints


def test_an_empty_directory_is_refused():
    with pytest.raises(ValueError, match="checkpoint_dir is an empty string"):
        Checkpointing("")


def test_a_directory_that_is_not_a_path():
    with pytest.raises(TypeError):
        Checkpointing(3)


@pytest.mark.parametrize("loops", [0, -1, 2.0, "3", True, None])
def test_a_bad_divergence_loops(loops):
    with pytest.raises(ValueError, match=f"divergence_loops must be an integer >= 1, got {loops}"):
        FaultPolicy(divergence_loops=loops)


@pytest.mark.parametrize("name", ["restore_on_divergence", "exit_on_preemption"])
@pytest.mark.parametrize("value", [1, "yes", None])
def test_a_flag_that_is_not_a_bool(name, value):
    with pytest.raises(ValueError, match=f"{name} must be True or False, got {value!r}"):
        FaultPolicy(**{name: value})


def test_the_checkpoint_state_uses_the_same_modes_and_keep_check():
    from tfaccel.train.state import checkpoint

    assert checkpoint.RESUME_MODES is RESUME_MODES
