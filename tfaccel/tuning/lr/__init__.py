"""The learning-rate range test: the ramp, its suggestion rule, its sizing and report."""
