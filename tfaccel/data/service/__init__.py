"""Preprocessing on tf.data service workers: `local(n)`, the relay, splits and the watch.

`local` (in `service.local`) starts a dispatcher and workers on this machine; `stage`
offloads a pipeline's stages to them; `relay` carries a launched job's Python
functions to the launcher's workers; `splits` and `count` keep a service epoch exact;
`watch` ends a stalled read in bounded time.
"""

from tfaccel.data.service.local import (
    ENV,
    ENV_FUNCTIONS,
    ENV_WORKERS,
    MODES,
    LocalService,
    PortInUseError,
    ServiceError,
    encode_functions,
    from_env,
    local,
    python_functions,
)

__all__ = [
    "ENV",
    "ENV_FUNCTIONS",
    "ENV_WORKERS",
    "MODES",
    "LocalService",
    "PortInUseError",
    "ServiceError",
    "encode_functions",
    "from_env",
    "local",
    "python_functions",
]
