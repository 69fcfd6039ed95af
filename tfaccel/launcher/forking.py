"""A warning in a process forked after TensorFlow's runtime started, which may hang.

TensorFlow's thread pools do not survive `fork`: a child (`os.fork`, `multiprocessing`'s
"fork" start method, Linux's default before Python 3.14) that trains or runs input
pipelines can wait for ever without a word. `import tfaccel` registers an
`os.register_at_fork` hook that says so on the child's stderr, naming the way out. It is
silent when the parent never started TensorFlow's runtime (imported it only, as the test
suite's fork server does), in a `subprocess` child (it runs another program), and with
`TFACCEL_FORK_WARNING=0` in the environment.
"""

from __future__ import annotations

import os
import sys
from types import FrameType

ENV = "TFACCEL_FORK_WARNING"
MESSAGE = (
    "tfaccel: this process was forked after TensorFlow's runtime started in its parent. "
    "TensorFlow does not survive fork: if this child uses it (model.fit, Trainer.fit, a "
    "tf.data pipeline) it can hang without a word. Start child processes with "
    "multiprocessing.get_context('spawn') (or 'forkserver'), or fork before TensorFlow "
    f"starts. ({ENV}=0 silences this.)\n"
)
_registered = False


def runtime_started() -> bool:
    """Whether TensorFlow's eager runtime has been initialised in this process (importing
    TensorFlow does not initialise it; the first op or device query does)."""
    context = sys.modules.get("tensorflow.python.eager.context")
    if context is None:
        return False
    handle = getattr(context, "_context", None)
    return bool(getattr(handle, "_initialized", False))


def _in_subprocess_launch() -> bool:
    """Whether the fork is `subprocess.Popen`'s (with `preexec_fn`): an exec follows."""
    frame: FrameType | None = sys._getframe(1)
    while frame is not None:
        code = frame.f_code
        if code.co_name == "_execute_child" and frame.f_globals.get("__name__") == "subprocess":
            return True
        frame = frame.f_back
    return False


def _after_in_child() -> None:
    if os.environ.get(ENV, "1") == "0" or not runtime_started() or _in_subprocess_launch():
        return
    try:
        os.write(2, MESSAGE.encode())  # no buffered stream: it may hold a lock the parent held
    except OSError:
        pass


def register() -> None:
    """Registers the fork hook once per process (`import tfaccel` calls it)."""
    global _registered
    if not _registered:
        os.register_at_fork(after_in_child=_after_in_child)
        _registered = True
