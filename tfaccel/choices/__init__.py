"""tfaccel's measured choices, in one home behind one protocol.

Every automatic setting that tfaccel decides by measuring on the user's hardware — the
dtype policy (`policy`), XLA (`xla`), steps per loop (`loop_size`), the step probe they
share (`timing`) and the operations' rates behind them (`operations`) — is a `Choice`: a
value, the reason, what was measured, what measuring cost. The Trainer makes them once per
`fit`, after its input is checked, through `resolve_fit` (`resolution`), in the order
written there.
"""

from tfaccel.choices.choice import Choice
from tfaccel.choices.resolution import Asked, Job, Resolved, Step, resolve_fit

__all__ = ["Asked", "Choice", "Job", "Resolved", "Step", "resolve_fit"]
