"""Variants timed in fresh processes, in alternating order: the guide ports' harness.

A script runs `python script.py --one VARIANT`, which prints one JSON line of what it
measured; `alternate` runs every variant once a round, each round starting one later
(the machine's drift touches all alike), and returns {variant: [result per round]}.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time


def spawn(script: str, variant: str, timeout_s: float = 900) -> dict:
    """Runs `script --one variant` in a fresh process; returns its last JSON line."""
    command = [sys.executable, script, "--one", variant]
    out = subprocess.run(command, capture_output=True, text=True, check=False, timeout=timeout_s)
    lines = [line for line in out.stdout.splitlines() if line.startswith("{")]
    if out.returncode or not lines:
        raise RuntimeError(f"{variant} failed:\n{out.stderr[-3000:]}")
    return json.loads(lines[-1])


def alternate(script: str, variants: list[str], rounds: int, timeout_s: float = 900) -> dict:
    """{variant: [results]}: `rounds` rounds of every variant in a fresh process, rotated."""
    runs: dict = {v: [] for v in variants}
    began = time.perf_counter()
    for index in range(rounds):
        shift = index % len(variants)
        for variant in variants[shift:] + variants[:shift]:
            runs[variant].append(spawn(script, variant, timeout_s))
        print(f"round {index + 1}: {time.perf_counter() - began:.0f} s", flush=True)
    return runs
