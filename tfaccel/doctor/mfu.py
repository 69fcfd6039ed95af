"""The doctor's model FLOPs utilisation (MFU) of the measured run.

MFU = training FLOPs per example (3 × the forward pass, counted from the graph as
`callbacks.Throughput` counts them) × the real step's examples/s ÷ the machine's matmul
peak in the compute dtype of the policy in use (`peak.MatmulPeak`), times the GPUs in
sync (a CPU's logical devices share its cores: one peak). The figure Lightning's
`ThroughputMonitor` and Composer's `SpeedMonitor` report.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import keras

from tfaccel.callbacks import peak

if TYPE_CHECKING:
    from tfaccel.doctor.verdict import Measured


@dataclasses.dataclass(frozen=True)
class Utilisation:
    """The measured run's MFU and what it was computed from.

    Attributes:
        mfu: achieved training FLOP/s ÷ the peak (a fraction).
        flops_per_example: training FLOPs of one example (forward + backward).
        examples_per_second: the real step's examples/s (global).
        peak_flops: the matmul peak of one device, FLOP/s, in `dtype`.
        devices: the devices whose peaks add up (GPUs in sync; 1 on a CPU).
        policy: the dtype policy in use; `dtype` its compute dtype.
    """

    mfu: float
    flops_per_example: float
    examples_per_second: float
    peak_flops: float
    devices: int
    policy: str
    dtype: str

    def line(self) -> str:
        """One line for the report."""
        devices = f" × {self.devices} devices" if self.devices > 1 else ""
        share = f"{self.mfu:.1%}" if self.mfu >= 0.01 else f"{self.mfu * 100:.2g}%"
        return (
            f"MFU: {share} — {_flops(self.flops_per_example)} an example × "
            f"{self.examples_per_second:,.0f} examples/s ÷ the measured {self.dtype} matmul "
            f"peak ({self.peak_flops / 1e9:,.0f} GFLOP/s{devices}; policy {self.policy})."
        )


def utilisation(
    flops_per_example: float | None,
    examples_per_second: float,
    peak_flops: float | None,
    devices: int = 1,
    policy: str = "float32",
) -> Utilisation | None:
    """The MFU from its parts; None when the FLOPs or the peak are unknown."""
    if not flops_per_example or not peak_flops or not examples_per_second > 0:
        return None
    mfu = flops_per_example * examples_per_second / (peak_flops * devices)
    dtype = keras.DTypePolicy(policy).compute_dtype
    return Utilisation(
        mfu, flops_per_example, examples_per_second, peak_flops, devices, policy, dtype
    )


def measure(model: keras.Model, x_spec: Any, measured: Measured) -> Utilisation | None:
    """The MFU of the doctor's real step (`measured`: a `verdict.Measured`).

    Reuses the FLOPs and the matmul peak the doctor measured when it has them in the
    policy's compute dtype (before the precision step replaces the peak with the best
    policy's), else counts the FLOPs from `model` on `x_spec` (the features' spec) and
    times a peak in that dtype.
    """
    from tfaccel.callbacks import _mfu

    flops = measured.flops_per_example or peak.training_flops_per_example(model, x_spec)
    if not flops:
        return None
    compute = keras.DTypePolicy(measured.dtype_policy).compute_dtype
    peak_flops = measured.matmul_peak
    if not peak_flops or keras.DTypePolicy(measured.matmul_peak_policy).compute_dtype != compute:
        peak_flops, _ = _mfu.measured_peak(model)
    devices = measured.replicas if measured.device == "GPU" else 1
    rate = measured.batch / measured.real_s
    return utilisation(flops, rate, peak_flops, devices, measured.dtype_policy)


def _flops(value: float) -> str:
    """FLOPs with a unit: 1.15 kFLOP, 12.3 MFLOP, 4.1 GFLOP."""
    for unit, scale in (("GFLOP", 1e9), ("MFLOP", 1e6), ("kFLOP", 1e3)):
        if value >= scale:
            return f"{value / scale:.3g} {unit}"
    return f"{value:.3g} FLOP"
