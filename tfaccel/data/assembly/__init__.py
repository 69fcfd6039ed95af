"""The pipeline's assembly: a source's ordered stages (`pipeline`), what a build returns
(`Built`, the `Feed`), its plan, shuffle sizing, the cache, and a benchmark.

(`tfaccel.data.build` is this package's old name; it still imports.)
"""
