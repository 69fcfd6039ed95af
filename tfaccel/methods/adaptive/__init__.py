"""Methods that adapt to the job as it runs: no declared length, or chosen by measurement.

- `Plateau`: a learning rate with no end date (a warm-up over the first epoch, then a
  decay the loss drives), so the declared epochs change nothing (`plateau.py`).
"""

from tfaccel.methods.adaptive.plateau import Plateau, PlateauCycle, PlateauDecay

__all__ = ["Plateau", "PlateauCycle", "PlateauDecay"]
