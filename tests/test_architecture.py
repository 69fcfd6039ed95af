"""The doctor and the tuner use the Trainer's public, documented members and the runner's
door (`tfaccel.train.step.runner_interface.RunnerInterface`) only: no private attribute of a
Trainer or a runner is read from `tfaccel/doctor/` or `tfaccel/tuning/`."""

import ast
import inspect
import pathlib
import re

import pytest

from tfaccel.train.step.runner_interface import RunnerInterface

ROOT = pathlib.Path(__file__).resolve().parents[1]
TOOLS = sorted(
    [*(ROOT / "tfaccel" / "doctor").rglob("*.py"), *(ROOT / "tfaccel" / "tuning").rglob("*.py")]
)
TRAINERS = {"trainer", "target"}  # names (or attributes: self.trainer, job.trainer) of a Trainer
RUNNERS = {"runner"}
PRIVATE_ANYWHERE = {"_prepare", "_loop_sizer", "_runner"}


def _holder(node: ast.Attribute) -> str | None:
    """The name the attribute is read from: `runner` for `runner.x`, `self.runner.x`,
    `job.runner.x`; None for anything else (a call's result, a subscript...)."""
    value = node.value
    if isinstance(value, ast.Name):
        return value.id
    if isinstance(value, ast.Attribute):
        return value.attr
    return None


def _reads(tree: ast.AST):
    """(holder, attribute, line) of every attribute read, `getattr(x, "name")` included."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            yield _holder(node), node.attr, node.lineno
        elif (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in ("getattr", "hasattr")
            and len(node.args) >= 2
            and isinstance(node.args[1], ast.Constant)
            and isinstance(node.args[1].value, str)
        ):
            holder = ast.Attribute(value=node.args[0], attr="", ctx=ast.Load())
            yield _holder(holder), node.args[1].value, node.lineno


def _door() -> set[str]:
    """The names `RunnerInterface` declares: its annotated attributes and its methods."""
    names = set(RunnerInterface.__annotations__)
    names |= {n for n in vars(RunnerInterface) if not n.startswith("_")}
    return names


def private_reads(source: str) -> list[str]:
    found = []
    for holder, attr, line in _reads(ast.parse(source)):
        private = attr.startswith("_") and not attr.startswith("__")
        if attr in PRIVATE_ANYWHERE or (private and holder in TRAINERS | RUNNERS):
            found.append(f"{line}: {holder}.{attr}")
    return found


def undeclared_runner_reads(source: str) -> list[str]:
    door = _door()
    return [
        f"{line}: {holder}.{attr}"
        for holder, attr, line in _reads(ast.parse(source))
        if holder in RUNNERS and attr not in door
    ]


def trainer_reads(source: str) -> set[str]:
    return {attr for holder, attr, _ in _reads(ast.parse(source)) if holder == "trainer"}


@pytest.mark.parametrize("path", TOOLS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_no_private_attribute_of_a_trainer_or_runner(path):
    found = private_reads(path.read_text())
    assert not found, f"{path.relative_to(ROOT)} reads private attributes:\n" + "\n".join(found)


@pytest.mark.parametrize("path", TOOLS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_what_is_used_of_a_runner_is_in_its_door(path):
    found = undeclared_runner_reads(path.read_text())
    assert not found, (
        f"{path.relative_to(ROOT)} uses runner members RunnerInterface does not declare "
        "(add them there, documented, and implement them in runner.Runner):\n" + "\n".join(found)
    )


def test_what_is_used_of_a_trainer_is_public_and_documented():
    from tfaccel.train.trainer import Trainer

    used = set().union(*(trainer_reads(path.read_text()) for path in TOOLS))
    assert {"feed", "fit"} <= used
    source = inspect.getsource(Trainer)
    for name in used:
        assert not name.startswith("_"), name
        member = inspect.getattr_static(Trainer, name, None)
        if member is None:  # an attribute the Trainer sets on itself (trainer.settings)
            assert re.search(rf"self\.{name}\b[^=\n]*=", source), f"Trainer has no {name}"
        else:
            assert inspect.getdoc(member), f"Trainer.{name} is used by a tool but not documented"


def test_the_runner_implements_its_door():
    from tfaccel.train.step.runner import Runner

    methods = {n for n in vars(RunnerInterface) if not n.startswith("_")}
    for name in methods:
        assert callable(getattr(Runner, name, None)) or isinstance(
            inspect.getattr_static(Runner, name, None), property
        ), name
    attributes = set(RunnerInterface.__annotations__)
    source = inspect.getsource(Runner.__init__)
    for name in attributes:
        assert f"self.{name} =" in source, f"Runner sets no {name}"


def test_the_checks_find_what_they_look_for():
    bad = "\n".join(
        [
            "x = trainer._loop_sizer.chosen",
            "y = self.trainer._prepare(data, 1, 'training')",
            "z = job.runner._held",
            "w = target._whatever",
            "v = getattr(runner, '_count_before', None)",
            "u = something._prepare()",
        ]
    )
    assert len(private_reads(bad)) == 6
    assert private_reads("a = model._private; b = self._clock; c = trainer.__class__") == []
    assert undeclared_runner_reads("a = runner.loss_tracker; b = job.runner.step") == [
        "1: runner.loss_tracker",
        "1: runner.step",
    ]
    assert undeclared_runner_reads("a = runner.train(it, 1); b = job.runner.strategy") == []
