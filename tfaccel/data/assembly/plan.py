"""What a pipeline is made of, in order, and how to print it (`explain`).

`pipeline` records one `Step` per stage it adds and attaches the resulting
`PipelinePlan` to the dataset it returns. `explain` prints that plan; for a dataset
built elsewhere it reads the stages from the dataset's own graph instead.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import tensorflow as tf

from tfaccel.data import graph as dataset_graph

_PLAN_ATTR = "_tfaccel_plan"


@dataclasses.dataclass
class Step:
    """One stage of a pipeline: its name and the settings it was built with."""

    name: str
    settings: dict[str, Any] = dataclasses.field(default_factory=dict)

    def __str__(self) -> str:
        details = ", ".join(f"{key}={value}" for key, value in self.settings.items())
        return f"{self.name:<11} {details}".rstrip()


@dataclasses.dataclass
class PipelinePlan:
    """The ordered stages of a pipeline plus a one-line summary."""

    title: str
    steps: list[Step] = dataclasses.field(default_factory=list)
    notes: list[str] = dataclasses.field(default_factory=list)

    def add(self, name: str, /, **settings: Any) -> None:
        """Appends a step named `name` with its settings."""
        self.steps.append(Step(name, settings))

    @property
    def names(self) -> list[str]:
        """The step names in pipeline order."""
        return [step.name for step in self.steps]

    def step(self, name: str) -> Step:
        """Returns the step called `name`.

        Raises:
            KeyError: no such step in this plan.
        """
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(f"No step {name!r} in this plan; steps are {self.names}.")

    def __str__(self) -> str:
        lines = [self.title]
        lines += [f"{i:>3}. {step}" for i, step in enumerate(self.steps, 1)]
        lines += [f"note: {note}" for note in self.notes]
        return "\n".join(lines)


Plan = PipelinePlan
"""The old name of `PipelinePlan` (the same class), kept so that code naming it still works."""


def attach(dataset: tf.data.Dataset, plan: PipelinePlan) -> tf.data.Dataset:
    """Stores `plan` on `dataset` so that `explain` can find it; returns the dataset."""
    setattr(dataset, _PLAN_ATTR, plan)
    return dataset


def plan_of(obj: Any) -> PipelinePlan:
    """Returns the `PipelinePlan` of a tfaccel pipeline, a `DatasetFn`, or any `tf.data.Dataset`.

    Args:
        obj: what `pipeline` returned, or any dataset (its plan is then read from
            the dataset graph, with one step per tf.data operation).

    Raises:
        TypeError: `obj` is neither a dataset nor a `DatasetFn`.
    """
    plan = getattr(obj, _PLAN_ATTR, None)
    if isinstance(plan, PipelinePlan):
        return plan
    if hasattr(obj, "plan") and callable(obj.plan):
        return obj.plan()
    if isinstance(obj, tf.data.Dataset):
        plan = PipelinePlan("tf.data pipeline (not built by tfaccel; read from its graph)")
        stages = graph_stages(obj)
        for op, parallelism in stages:
            plan.add(op, **({} if parallelism is None else {"parallel": _calls(parallelism)}))
        plan.notes += [f"missing: {words}" for _, words in missing(stages)]
        return plan
    raise TypeError(
        f"explain() takes a tf.data.Dataset or what tfaccel.data.pipeline returned, "
        f"got {type(obj).__name__}."
    )


def explain(obj: Any) -> str:
    """Returns a readable, numbered plan of a pipeline: each step in order with its settings.

    Args:
        obj: the dataset or `DatasetFn` returned by `tfaccel.data.pipeline`, or any
            `tf.data.Dataset` (then the steps are the dataset's graph operations).

    Returns:
        A multi-line string, e.g.::

            tfaccel.data pipeline: training, global batch 64, 1 replica
              1. source      kind=arrays, elements=1000, ...
              2. preprocess  fn=normalize, parallel=AUTOTUNE, deterministic=False
              ...

    Raises:
        TypeError: `obj` is neither a dataset nor a `DatasetFn`.
    """
    return str(plan_of(obj))


def graph_ops(dataset: tf.data.Dataset) -> list[str]:
    """Returns the dataset operations of `dataset`'s graph, source first.

    Follows the main input chain back from the output, so an `interleave`'s inner
    datasets or a zip's second branch are not listed. Names are TensorFlow op
    names without their version suffix, e.g. `["TensorSlice", "ParallelMap",
    "Cache", "Shuffle", "Batch", "Prefetch"]`; `Dataset.from_generator` (a flat_map
    over a generator) is "Generator".
    """
    return [name for name, _ in graph_stages(dataset)]


def graph_stages(dataset: tf.data.Dataset) -> list[tuple[str, int | None]]:
    """`graph_ops` with each operation's parallelism: `num_parallel_calls` of a
    `Parallel*` operation (-1: AUTOTUNE), else None. A `Map` is 1 where it runs on one
    core, -1 where tf.data parallelizes it itself (`map_parallelization`, on by default,
    rewrites a map whose function is stateless; a random op makes it stateful)."""
    policy = tf.data.experimental.ExternalStatePolicy.IGNORE
    graph = dataset_graph.serialized_graph(dataset, policy)
    nodes = {node.name: node for node in graph.node}
    output = next(node for node in graph.node if node.op == "_Retval")
    stages = []
    name = output.input[0]
    while name:
        node = nodes[name.split(":")[0]]
        inputs = [i for i in node.input if not i.startswith("^")]
        if node.op.endswith("Dataset") or "Dataset" in node.op:
            parallelism = _parallelism(node, inputs, nodes)
            if parallelism == 1 and _parallelized_by_tf_data(node, graph, dataset.options()):
                parallelism = -1
            short = _short(node.op)
            if short == "FlatMap" and _reads_generator(node, graph):
                short, parallelism = "Generator", 1  # Dataset.from_generator, read in turn
            stages.append((short, parallelism))
        name = next((i for i in inputs if "Dataset" in nodes[i.split(":")[0]].op), "")
    return stages[::-1]


# Operations that change nothing the doctor reasons about (they follow a pipeline's end).
_PASS_THROUGH = ("Options", "Model", "MaxIntraOpParallelism", "PrivateThreadPool")


def ends_with_prefetch(stages: list[tuple[str, int | None]]) -> bool:
    """Whether the last real operation (options and the like aside) is a prefetch."""
    real = [op for op, _ in stages if op not in _PASS_THROUGH]
    return bool(real) and real[-1] == "Prefetch"


def missing(stages: list[tuple[str, int | None]]) -> list[tuple[str, str]]:
    """What a pipeline lacks, as `(key, words)`: "parallel_source" (a Python generator
    read one element at a time), "parallel_map" (maps on one core), "prefetch" (the
    input does not overlap the step), "cache" (maps redo their work every epoch). The
    doctor's fixes and `explain` use these words."""
    names = [op for op, _ in stages]
    out = []
    if any(op == "Generator" for op in names):
        out.append(
            (
                "parallel_source",
                "parallel reading: a Python generator is read one element at a time "
                "(tfaccel.data.from_generator(fn, shards=N) reads N shards at once)",
            )
        )
    sequential = [op for op, par in stages if op.endswith("Map") and par == 1]
    if sequential:
        out.append(
            (
                "parallel_map",
                f"parallelism: {len(sequential)} map(s) run on one core at a time "
                "(map(..., num_parallel_calls=tf.data.AUTOTUNE))",
            )
        )
    if not ends_with_prefetch(stages):
        out.append(
            (
                "prefetch",
                "prefetch: the next batch is made only when the step asks for it "
                "(end with .prefetch(tf.data.AUTOTUNE))",
            )
        )
    if any(op.endswith("Map") for op in names) and not any(op.startswith("Cache") for op in names):
        out.append(
            (
                "cache",
                "cache: the maps redo their work every epoch (cache() after the "
                "deterministic maps, if their output fits)",
            )
        )
    return out


def _calls(parallelism: int) -> str:
    return "AUTOTUNE" if parallelism == -1 else str(parallelism)


def _parallelism(node, inputs: list[str], nodes: dict) -> int | None:
    short = _short(node.op)
    if short == "Map":
        return 1
    if not short.startswith("Parallel") or not inputs:
        return None
    const = nodes.get(inputs[-1].split(":")[0])  # num_parallel_calls is the last input
    if const is None or const.op != "Const":
        return None
    values = list(const.attr["value"].tensor.int64_val) or list(const.attr["value"].tensor.int_val)
    return int(values[0]) if values else None


def _parallelized_by_tf_data(node, graph, options: tf.data.Options) -> bool:
    """Whether tf.data's default `map_parallelization` rewrite runs this map in parallel."""
    optimization = options.experimental_optimization
    if options.autotune.enabled is False or optimization.apply_default_optimizations is False:
        return False
    if optimization.map_parallelization is False:
        return False
    name = node.attr["f"].func.name
    function = next((f for f in graph.library.function if f.signature.name == name), None)
    return function is not None and not function.signature.is_stateful


def _reads_generator(node, graph) -> bool:
    """Whether a flat_map's function makes a `Dataset.from_generator` dataset."""
    name = node.attr["f"].func.name
    function = next((f for f in graph.library.function if f.signature.name == name), None)
    return function is not None and any(n.op == "GeneratorDataset" for n in function.node_def)


def _short(op: str) -> str:
    base = op.split("Dataset")[0]
    return base or op
