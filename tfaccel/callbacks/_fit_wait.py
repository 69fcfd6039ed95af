"""Times the wait for each batch in `model.fit` (TensorFlow backend, steps_per_execution 1).

Keras's train function reads the batch inside its `tf.function`, where Python cannot
time it. Its Python entry point also accepts a plain iterable of batches, which it runs
through the same compiled one-step function. So the wrapper installed here pulls the
batch eagerly — `next()` on Keras's own (distributed) iterator, timed: that is the wait
— and hands it over as a one-element list. The step itself is unchanged; the difference
is one eager op per step instead of one inside the graph (tens of microseconds).

With `steps_per_execution > 1` the same entry point would run the steps one Python call
each, which changes what is measured, so nothing is installed then.
"""

from __future__ import annotations

import time

ORIGINAL = "_tfaccel_unwrapped_train_function"


def unwrap(model) -> None:
    """Puts back the model's own train function, if a wrapper is installed."""
    function = getattr(model, "train_function", None)
    original = getattr(function, ORIGINAL, None)
    if original is not None:
        model.train_function = original


def install(model, owner) -> bool:
    """Wraps `model.train_function` so that `owner.fit_wait` gets each call's wait.

    The wrapper times a call only when `owner.expect_call` is set (by its batch-begin
    hook) and clears it; a call it does not expect (a later `fit` without the callback,
    after a crash skipped `on_train_end`) removes the wrapper and runs untimed.

    Returns:
        Whether a wrapper is installed (False: no train function to wrap, or
        `steps_per_execution > 1`).
    """
    unwrap(model)
    original = getattr(model, "train_function", None)
    if original is None or not callable(original):
        return False
    if int(getattr(model, "steps_per_execution", 1) or 1) != 1:
        return False

    def timed_train_function(iterator):
        if not owner.expect_call or isinstance(iterator, (list, tuple)):
            unwrap(model)
            return original(iterator)
        owner.expect_call = False
        began = time.perf_counter()
        batch = next(iterator)  # StopIteration ends the epoch, as Keras expects
        owner.fit_wait = time.perf_counter() - began
        return original([batch])

    setattr(timed_train_function, ORIGINAL, original)
    model.train_function = timed_train_function
    return True
