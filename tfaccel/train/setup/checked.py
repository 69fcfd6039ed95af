"""What a Trainer has checked already: the label contract once per data, model and loss.

`fit` checks that the labels fit the model's output and the loss
(`tfaccel.data.check`), reading the first batch. A later `fit` of the same Trainer on
the same data reads nothing again. "The same data" is its content identity where a
tfaccel source gives one cheaply (arrays: their digest, made when the source is; files:
names, sizes and modification times), else the very same data object (a dataset or a
dataset function, held weakly); the element spec, the model object and the loss are part
of the key. Only a passed check is remembered: a failure is raised again every time.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable
from typing import Any

import keras

from tfaccel.data import graph
from tfaccel.data.assembly.feed import Feed
from tfaccel.data.contracts.label_contract import check as check_labels
from tfaccel.data.sources.info import source_info
from tfaccel.train.setup.startup import Clock


class Checked:
    """The keys of the label checks this Trainer passed (see the module docstring).

    Attributes:
        label_reads: how many times the label contract was checked (read the data).
    """

    def __init__(self) -> None:
        self._passed: set[tuple[Hashable, ...]] = set()
        self._objects: dict[int, weakref.ref] = {}
        self.label_reads = 0

    def labels(
        self,
        feed: Feed,
        model: keras.Model,
        loss: keras.losses.Loss | Callable[..., Any] | None,
        clock: Clock | None = None,
    ) -> None:
        """Checks the label contract unless this key passed before; then `clock` laps
        "label contract" (a `setup.startup.Startup`). No loss (None: the model's own
        steps compute theirs, `setup.model_steps`) has no contract to check.

        Raises:
            ValueError: as `tfaccel.data.check`.
        """
        if loss is None:
            return
        data = self._identity(feed)
        key = None if data is None else (data, repr(feed.element_spec), id(model), id(loss))
        if key is None or key not in self._passed:
            self.label_reads += 1
            check_labels(feed.probe, model, loss)
            if key is not None:
                self._passed.add(key)
        if clock is not None:
            clock.lap("label contract")

    def _identity(self, feed: Feed) -> tuple[str, Hashable] | None:
        content = source_identity(feed)
        if content is not None:
            return ("content", content)
        try:
            ref = weakref.ref(feed.data)
        except TypeError:
            return None  # not weakly referable: checked every time
        known = self._objects.get(id(feed.data))
        if known is not None and known() is not feed.data:
            self._passed = {key for key in self._passed if key[0] != ("object", id(feed.data))}
        self._objects[id(feed.data)] = ref
        return ("object", id(feed.data))


def source_identity(feed: Feed) -> str | None:
    """The content digest of the tfaccel source `feed` reads, when one gives it cheaply."""
    for node in graph.chain(feed.dataset):
        info = source_info(node)
        if info is not None:
            if info.identity is None:
                return None
            return f"{info.kind}:{info.identity()[0]}"
    return None
