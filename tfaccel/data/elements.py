"""Element structure: `(features, label)` pairs, optionally with a sample weight.

Sources yield `(features, label)` or `(features, label, sample_weight)`; the pipeline's
stages call user functions with the pair and carry the weight beside it.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE


def name(fn: Callable) -> str:
    """A function's name, for plans and messages."""
    return getattr(fn, "__name__", type(fn).__name__)


def unpack(data: Any) -> tuple:
    """Splits an element into `(x, y, sample_weight)` (None without a weight)."""
    if len(data) == 3:
        return data
    return data[0], data[1], None


def is_pair(element_spec: Any) -> bool:
    """Whether a dataset's elements are `(features, label)` pairs."""
    return isinstance(element_spec, tuple) and len(element_spec) == 2


def is_weighted(element_spec: Any) -> bool:
    """Whether a dataset's elements are `(features, label, sample_weight)` triples."""
    return isinstance(element_spec, tuple) and len(element_spec) == 3


def require_pair(element_spec: Any, where: str) -> None:
    """Raises TypeError unless elements are `(features, label)` pairs, or such a pair
    with a sample weight: `(features, label, sample_weight)`.

    Args:
        element_spec: a dataset's `element_spec` (or one element).
        where: what needed the pair, for the message.
    """
    if not is_pair(element_spec) and not is_weighted(element_spec):
        raise TypeError(
            f"{where} needs (features, label) pairs, but the elements are "
            f"{_describe_spec(element_spec)}. Return a 2-tuple `(features, label)` "
            "(features may be a dict), e.g. `lambda x: (x['image'], x['label'])`."
        )


def _describe_spec(spec: Any) -> str:
    if isinstance(spec, tuple):
        return f"a tuple of {len(spec)}: {spec}"
    return f"{type(spec).__name__} {spec}"


def takes_element(fn: Callable, count: int, **keywords: Any) -> bool | None:
    """Whether `fn` can be called with `count` positional arguments (and `keywords`);
    None when its signature cannot be read."""
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):  # builtins and some C callables have none
        return None
    try:
        signature.bind(*range(count), **keywords)
    except TypeError:
        return False
    return True


def carrying_weight(fn: Callable, where: str) -> Callable:
    """`fn(features, label, **kw) -> (features, label)` as a function of
    `(features, label, sample_weight, **kw)` that returns the weight beside its result."""

    def carried(features, label, sample_weight, **keywords):
        result = fn(features, label, **keywords)
        if not is_pair(result):
            raise TypeError(
                f"{where} must return a (features, label) pair (the sample weight rides "
                f"beside it), but returned {_describe_spec(result)}."
            )
        return result[0], result[1], sample_weight

    return carried


def on_pairs(fn: Callable, element_spec: Any, where: str, **keywords: Any) -> Callable:
    """`fn` for a dataset's elements: for `(features, label, sample_weight)` triples and a
    `fn` that cannot take three arguments, `fn` is called with the pair and the weight
    rides along (`carrying_weight`); otherwise `fn` itself."""
    if is_weighted(element_spec) and takes_element(fn, 3, **keywords) is False:
        return carrying_weight(fn, where)
    return fn
