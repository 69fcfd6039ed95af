"""The old name of `tfaccel.data.assembly`, kept so that old import paths still work.

`tfaccel.data.build.pipeline`, `.plan`, `.feed`, `.cache`, `.stages`, `.built`, `.sizing` and
`.bench` are the very modules of `tfaccel.data.assembly` (the same objects, not copies), and
`tfaccel.data.build.graph` is `tfaccel.data.graph`. New code imports `tfaccel.data` (the
public names) or `tfaccel.data.assembly`.
"""

from __future__ import annotations

import sys

from tfaccel.data import graph
from tfaccel.data.assembly import bench, built, cache, feed, pipeline, plan, sizing, stages

for _module in (bench, built, cache, feed, graph, pipeline, plan, sizing, stages):
    sys.modules[f"{__name__}.{_module.__name__.rsplit('.', 1)[1]}"] = _module
del _module
