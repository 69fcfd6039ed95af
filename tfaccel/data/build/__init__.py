"""The pipeline builder: its ordered stages, the Feed, the plan, the cache, and a benchmark."""
