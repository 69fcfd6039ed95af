"""The doctor: a measured verdict of what limits training, and the fix with its gain.

Example:
    >>> report = tfaccel.doctor.diagnose(trainer, train_data)     # doctest: +SKIP
    >>> print(report)              # verdict, rates, ranked fixes with predicted gains
    >>> report.plot("runs/doctor.png"); report.to_dict()

The live counterpart is `tfaccel.callbacks.Bottleneck` (shares of each epoch's time).
"""

from tfaccel.callbacks.peak import matmul_peak, training_flops_per_example
from tfaccel.doctor.diagnose import diagnose
from tfaccel.doctor.mfu import Utilisation
from tfaccel.doctor.report import Report
from tfaccel.doctor.service_fix import service_fixes
from tfaccel.doctor.verdict import Fix, Measured

__all__ = [
    "Fix",
    "Measured",
    "Report",
    "Utilisation",
    "diagnose",
    "matmul_peak",
    "service_fixes",
    "training_flops_per_example",
]
