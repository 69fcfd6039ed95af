"""tfaccel's measured choices: one protocol (`Choice`), one home."""
