"""`split`: cuts a functional or Sequential Keras model into pipeline stages.

A cut goes between two layer calls where exactly one tensor is alive: every path
from the model's inputs to its outputs passes through that tensor, so the stage
before the cut hands the stage after it a single tensor. Each stage is a
functional `keras.Model` that calls the original layers (so it shares their
weights) on a new `keras.Input`.

Example:
    >>> model = tfaccel.models.resnet(50, input_shape=(224, 224, 3), num_classes=1000)
    >>> stages = split(model, num_stages=2, balance="params")
    >>> [s.count_params() for s in stages]                          # doctest: +SKIP
    [14623680, 10986472]
"""

from __future__ import annotations

import itertools
import operator
from dataclasses import dataclass

import keras
from keras import tree

from tfaccel.errors import SplitError
from tfaccel.parallel import costs

BALANCES = ("params", "flops")


@dataclass
class _Graph:
    """A functional model's layer calls in topological order, and where it can be cut."""

    model: keras.Model
    nodes: list
    cuts: list[int]  # cut after nodes[k]
    crossing: dict  # cut → the one tensor that passes it
    blocked: dict[int, str]  # single-tensor cut → the shared layer that straddles it


def split(model: keras.Model, num_stages: int = 2, *, balance: str = "params") -> list:
    """Cuts `model` into `num_stages` consecutive stages of balanced cost.

    Stages are chosen among the valid cut points so that the costliest stage is as
    cheap as possible (then the cheapest as costly as possible). Layers called
    more than once (shared layers) stay within one stage.

    Args:
        model: a built functional or Sequential `keras.Model`.
        num_stages: number of stages, >= 1.
        balance: "params" (parameter count, i.e. weight memory) or "flops"
            (estimated forward FLOPs per example, i.e. compute time; needs static
            input shapes).

    Returns:
        A list of `num_stages` functional `keras.Model`s; stage i's output is stage
        i+1's input, and chaining them computes `model`. They share `model`'s layers.

    Raises:
        SplitError: a subclassed or unbuilt model, or fewer valid cut points than
            `num_stages - 1` (the message names the largest possible number of
            stages and any shared layer that prevents a cut).
        ValueError: a bad `num_stages` or `balance`.
    """
    num_stages = _positive_int(num_stages, "num_stages")
    if balance not in BALANCES:
        raise ValueError(f"balance must be one of {BALANCES}, got {balance!r}.")
    graph = _analyse(model)
    if num_stages - 1 > len(graph.cuts):
        raise SplitError(_too_many_stages(graph, num_stages))
    bounds = [-1, *graph.cuts, len(graph.nodes) - 1]
    if balance == "params":
        seen: set = set()
        node_costs = [costs.node_params(node, seen) for node in graph.nodes]
    else:
        node_costs = [costs.node_flops(node) for node in graph.nodes]
    chunks = [sum(node_costs[a + 1 : b + 1]) for a, b in itertools.pairwise(bounds)]
    groups = _partition(chunks, num_stages)
    ends = [bounds[g] for g in groups[1:]]  # last node index of each stage
    starts = [0, *[e + 1 for e in ends[:-1]]]
    return [
        _build_stage(graph, start, end, index, num_stages)
        for index, (start, end) in enumerate(zip(starts, ends, strict=True))
    ]


def _positive_int(value, name: str) -> int:
    try:
        number = operator.index(value)
    except TypeError:
        number = None
    if number is None or isinstance(value, bool) or number < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}.")
    return number


def _functional(model):
    if not isinstance(model, keras.Model):
        raise SplitError(f"split needs a keras.Model, got {type(model).__name__}.")
    graph = getattr(model, "_functional", None) if isinstance(model, keras.Sequential) else model
    if isinstance(model, keras.Sequential) and graph is None:
        raise SplitError(
            f"Sequential model {model.name!r} has no input shape yet, so its layer graph "
            "is unknown. Start it with keras.Input(shape=...) or call model.build(shape) first."
        )
    if getattr(graph, "_nodes_by_depth", None) is None:
        raise SplitError(
            f"split needs a functional or Sequential model; {model.name!r} is a subclassed "
            f"{type(model).__name__} whose call() is Python code, so its layer graph is "
            "unknown. Build each stage as a keras.Model yourself and pass the list to "
            "PipelineModel."
        )
    return graph


def _analyse(model) -> _Graph:
    graph = _functional(model)
    by_depth = graph._nodes_by_depth
    nodes = [
        node
        for depth in sorted(by_depth, reverse=True)
        for node in by_depth[depth]
        if node.operation is not None and not node.is_input
    ]
    produced = {id(t): -1 for t in tree.flatten(graph.inputs)}
    last_use = dict.fromkeys(produced, -1)
    for index, node in enumerate(nodes):
        for tensor in node.input_tensors:
            last_use[id(tensor)] = max(last_use.get(id(tensor), -1), index)
        for tensor in node.outputs:
            produced[id(tensor)] = index
            last_use.setdefault(id(tensor), index)
    outputs = {id(t) for t in tree.flatten(graph.outputs)}
    for key in outputs:
        last_use[key] = len(nodes)
    calls: dict[int, list[int]] = {}
    for index, node in enumerate(nodes):
        calls.setdefault(id(node.operation), []).append(index)
    tensors = {id(t): t for node in nodes for t in node.outputs}
    cuts, crossing, blocked = [], {}, {}
    for k in range(len(nodes) - 1):
        alive = [t for t, p in produced.items() if p <= k < last_use[t]]
        if len(alive) != 1 or produced[alive[0]] < 0 or alive[0] in outputs:
            continue
        crossing[k] = tensors[alive[0]]
        straddling = [
            nodes[where[0]].operation.name for where in calls.values() if where[0] <= k < where[-1]
        ]
        if straddling:
            blocked[k] = straddling[0]
        else:
            cuts.append(k)
    return _Graph(model=model, nodes=nodes, cuts=cuts, crossing=crossing, blocked=blocked)


def _too_many_stages(graph: _Graph, num_stages: int) -> str:
    most = len(graph.cuts) + 1
    message = (
        f"Cannot split model {graph.model.name!r} into {num_stages} stages: it has "
        f"{len(graph.cuts)} valid cut point(s) (a layer boundary where a single tensor "
        f"passes on), so the largest possible number of stages is {most}. "
    )
    if graph.blocked:
        shared = sorted(set(graph.blocked.values()))
        message += (
            f"Layer(s) {shared} are shared (called more than once) across "
            f"{len(graph.blocked)} otherwise valid cut point(s); a shared layer's weights "
            "must live in one stage. Give each call its own layer to allow those cuts. "
        )
    return message + f"Pass num_stages <= {most}."


def _partition(chunks: list[int], parts: int) -> list[int]:
    """Start indices of `parts` contiguous groups of `chunks`: min max, then max min."""
    n = len(chunks)
    prefix = [0]
    for cost in chunks:
        prefix.append(prefix[-1] + cost)

    def solve(limit):
        # best[p][i]: (max, -min) of the best grouping of chunks[:i] into p groups.
        inf = (float("inf"), 0)
        best = [[inf] * (n + 1) for _ in range(parts + 1)]
        choice = [[0] * (n + 1) for _ in range(parts + 1)]
        best[0][0] = (0, -float("inf"))
        for p in range(1, parts + 1):
            for i in range(p, n - (parts - p) + 1):
                for j in range(p - 1, i):
                    if best[p - 1][j] == inf:
                        continue
                    group = prefix[i] - prefix[j]
                    if limit is not None and group > limit:
                        continue
                    prev_max, prev_neg_min = best[p - 1][j]
                    candidate = (max(prev_max, group), max(prev_neg_min, -group))
                    if limit is not None:
                        candidate = (0, candidate[1])
                    if candidate < best[p][i]:
                        best[p][i], choice[p][i] = candidate, j
        return best, choice

    best, _ = solve(None)
    _, choice = solve(best[parts][n][0])
    starts, i = [], n
    for p in range(parts, 0, -1):
        i = choice[p][i]
        starts.append(i)
    return starts[::-1] + [n]


def _stage_input(tensor, name: str):
    return keras.Input(batch_shape=tuple(tensor.shape), dtype=tensor.dtype, name=name)


def _build_stage(graph: _Graph, start: int, end: int, index: int, count: int) -> keras.Model:
    functional = _functional(graph.model)
    name = f"{graph.model.name}_stage{index}"
    if start == 0:
        originals = tree.flatten(functional.inputs)
        inputs = [_stage_input(t, f"{name}_input{i}") for i, t in enumerate(originals)]
        structure = getattr(functional, "_inputs_struct", originals)
        stage_inputs = tree.pack_sequence_as(structure, inputs)
    else:
        originals = [graph.crossing[start - 1]]
        inputs = [_stage_input(originals[0], f"{name}_input")]
        stage_inputs = inputs[0]
    values = {id(old): new for old, new in zip(originals, inputs, strict=True)}
    for node in graph.nodes[start : end + 1]:
        args, kwargs = node.arguments.fill_in(values)
        result = node.operation(*args, **kwargs)
        for old, new in zip(node.outputs, tree.flatten(result), strict=True):
            values[id(old)] = new
    if index == count - 1:
        outputs = tree.map_structure(lambda t: values[id(t)], functional._outputs_struct)
    else:
        outputs = values[id(graph.crossing[end])]
    return keras.Model(stage_inputs, outputs, name=name)
