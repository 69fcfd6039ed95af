"""`tfaccel.data.service.local` with its servers forked from the worker zygote (forked.py).

Each server of `local()` is a fresh `python -m tfaccel data-service ...` that imports
TensorFlow (~5 s of CPU). `forked_local(zygote, workers, ...)` starts them as
`forked_worker.py` stand-ins instead: the server is a fork of the zygote, with the
stand-in's streams, environment and directory, and it dies with its stand-in. For the
tests of what a service serves; the tests of processes (kills, what is left after
close, the stall watch, which reads the servers' CPU) start real ones.
"""

import os
import shlex
import stat
import sys
import tempfile

import pytest

from tfaccel.data import service as service_lib


def forked_local(zygote, workers, **settings):
    """`service_lib.local(workers, **settings)`, its servers forked from `zygote`."""
    with tempfile.TemporaryDirectory(prefix="forked-service-") as folder:
        python = os.path.join(folder, "python")
        stand_in = zygote.command([sys.executable])  # [python, forked_worker.py, SOCKET]
        with open(python, "w") as script:
            script.write("#!/bin/sh\nexec " + shlex.join(stand_in) + ' "$@"\n')
        os.chmod(python, os.stat(python).st_mode | stat.S_IEXEC)
        with pytest.MonkeyPatch.context() as patch:  # read by local()'s Popen only
            patch.setattr(sys, "executable", python)
            return service_lib.local(workers, **settings)
