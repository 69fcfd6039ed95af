"""`TuningJob`: the training job a tuner measures, and the bounds on its tuning.

The batch-size tuners (`find_batch_size`, `largest_batch_size`) and `tune` take the job
first: a `TuningJob`, or its fields — `build_model` and `data` positionally, the rest as
keywords — from which they build one (`job_from`). Keywords given with a `TuningJob`
replace its fields. An entry point's other options are its own (a `BatchSearch` for
`find_batch_size`, the untuned batch and rate for `tune`); `keywords` tells each keyword
to the object whose field it names, and refuses one that names none.

Example:
    >>> job = tfaccel.tuning.TuningJob(                               # doctest: +SKIP
    ...     build_model, (x_train, y_train), loss="sparse_categorical_crossentropy",
    ...     optimizer="adam", job_examples=10 * len(x_train))
    >>> report = tfaccel.tuning.find_batch_size(job)
    >>> tuned = tfaccel.tuning.tune(job, batch_size=32, learning_rate=1e-3)
"""

from __future__ import annotations

import dataclasses
import difflib
from collections.abc import Callable
from typing import Any

import keras
import tensorflow as tf


@dataclasses.dataclass(frozen=True, eq=False)
class TuningJob:
    """The training job tuned: what it trains, on what, where, how big it is, and how long
    its tuning may take.

    Attributes:
        build_model: zero-argument callable returning a `keras.Model` (called per probe,
            inside `strategy.scope()`).
        data: an *unbatched* `tf.data.Dataset` of `(x, y)`, or an `(x, y)` tuple of arrays.
        loss: the loss, as for `model.compile`.
        optimizer: a Keras optimizer (cloned per probe), its name, or a callable building
            one; its slots count towards memory. None: the tuner's default ("sgd" for the
            batch searches, "adam" for `tune`).
        strategy: a `tf.distribute.Strategy`; None: the default strategy. Batches are global.
        job_examples: the size of the training job (epochs × examples per epoch): the
            tuning then keeps within `budget.PROBE_SHARE` (10 %) of the job's time
            (`find_batch_size`, `tune`; `largest_batch_size` asks memory alone).
        budget_s: wall seconds the tuning may take.

    Raises:
        TypeError: `build_model` is not callable, or is a model (not the function).
        ValueError: `job_examples` < 1 or `budget_s` < 0.
    """

    build_model: Callable[[], keras.Model]
    data: Any
    loss: Any
    optimizer: Any = None
    strategy: tf.distribute.Strategy | None = None
    job_examples: int | None = None
    budget_s: float | None = None

    def __post_init__(self) -> None:
        if not callable(self.build_model) or isinstance(self.build_model, keras.Model):
            raise TypeError(
                f"build_model must be a zero-argument callable returning a keras.Model, got "
                f"{type(self.build_model).__name__}. Pass the function, not a model: e.g. "
                "find_batch_size(lambda: make_model(), data, loss=...)."
            )
        budget_s = self.budget_s
        if budget_s is not None and (isinstance(budget_s, bool) or not budget_s >= 0):
            raise ValueError(f"budget_s must be a number of seconds >= 0, got {budget_s!r}.")
        examples = self.job_examples
        if examples is not None and (
            isinstance(examples, bool) or not isinstance(examples, int) or examples < 1
        ):
            raise ValueError(f"job_examples must be an integer >= 1, got {examples!r}.")


def field_names(kind: type) -> tuple[str, ...]:
    """A dataclass's field names, in order."""
    return tuple(f.name for f in dataclasses.fields(kind))


def keywords(caller: str, given: dict[str, Any], *kinds: type) -> list[dict[str, Any]]:
    """`given` split by the dataclass among `kinds` whose field each keyword names.

    Raises:
        TypeError: a keyword names no field of them (the message names what `caller`
            takes, and the nearest name).
    """
    parts: list[dict[str, Any]] = [{} for _ in kinds]
    names = [field_names(kind) for kind in kinds]
    for key, value in given.items():
        owner = next((i for i, fields in enumerate(names) if key in fields), None)
        if owner is None:
            every = [name for fields in names for name in fields]
            near = difflib.get_close_matches(key, every, n=1)
            hint = f" (did you mean {near[0]!r}?)" if near else ""
            takes = " and of ".join(
                f"{kind.__name__} ({', '.join(fields)})"
                for kind, fields in zip(kinds, names, strict=True)
            )
            raise TypeError(
                f"{caller}() got an unexpected keyword argument {key!r}{hint}. Beside its "
                f"own, it takes the fields of {takes}."
            )
        parts[owner][key] = value
    return parts


def job_from(caller: str, job: Any, data: Any, fields: dict[str, Any]) -> TuningJob:
    """The job `caller` tunes: `job` itself, a `TuningJob` (its fields replaced by any
    keywords given), or one built from `build_model` (`job`), `data` and the keywords.

    Raises:
        TypeError: data passed beside a `TuningJob` (it holds its own), a field given
            twice, or a required field missing.
    """
    if isinstance(job, TuningJob):
        if data is not None:
            raise TypeError(
                f"{caller}() got data beside a TuningJob, which holds its own: pass "
                "TuningJob(build_model, data, ...) alone, or data=... to replace the job's."
            )
        return dataclasses.replace(job, **fields) if fields else job
    fields = dict(fields)
    for name, value in (("build_model", job), ("data", data)):
        if value is not None:
            if name in fields:
                raise TypeError(f"{caller}() got {name} twice: positionally and as {name}=.")
            fields[name] = value
    missing = [f.name for f in dataclasses.fields(TuningJob) if _required(f)]
    missing = [name for name in missing if name not in fields]
    if missing:
        raise TypeError(
            f"{caller}() needs the job it tunes: a TuningJob, or build_model and data "
            f"(positionally) and loss=...; missing: {', '.join(missing)}."
        )
    return TuningJob(**fields)


def _required(field: dataclasses.Field) -> bool:
    return field.default is dataclasses.MISSING and field.default_factory is dataclasses.MISSING
