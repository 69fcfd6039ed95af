"""The batch-size search: memory, throughput knee, gradient noise scale, its report."""
