"""Element structure: `(features, label)` pairs, optionally with a sample weight.

Sources yield `(features, label)` or `(features, label, sample_weight)`; the pipeline's
stages call user functions with the pair and carry the weight beside it.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

AUTOTUNE = tf.data.AUTOTUNE


def is_pair(element_spec: Any) -> bool:
    """Whether a dataset's elements are `(features, label)` pairs."""
    return isinstance(element_spec, tuple) and len(element_spec) == 2


def require_pair(element_spec: Any, where: str) -> None:
    """Raises TypeError unless elements are `(features, label)` pairs.

    Args:
        element_spec: a dataset's `element_spec`.
        where: what needed the pair, for the message.
    """
    if not is_pair(element_spec):
        raise TypeError(
            f"{where} needs (features, label) pairs, but the elements are "
            f"{_describe_spec(element_spec)}. Return a 2-tuple `(features, label)` "
            "(features may be a dict), e.g. `lambda x: (x['image'], x['label'])`."
        )


def _describe_spec(spec: Any) -> str:
    if isinstance(spec, tuple):
        return f"a tuple of {len(spec)}: {spec}"
    return f"{type(spec).__name__} {spec}"
