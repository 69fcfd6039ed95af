"""Time to accuracy of the Trainer's automatic precision and XLA choice, on the held-out jobs.

Issue 67's target: `precision="auto"` with `jit_compile="auto"` reaches each held-out job's
target in at most 1/0.97 of the time the best *fixed* setting takes. The fixed settings are
float32 and, only where this host has bf16 (`tfaccel.precision.candidates()` lists
`mixed_bfloat16`: a GPU with compute capability >= 8.0, or a CPU with `avx512_bf16` /
`amx_bf16`), `mixed_bfloat16`, each with `jit_compile` False and True. Every setting trains
the job's published recipe (its model, loss, batch, declared epochs and callbacks;
`heldout_jobs.py`) through `tfaccel.Trainer(..., methods=None)`; only the precision and XLA
arguments differ.

Time to target: wall seconds from just before `Trainer(...)` (the choices, start-up and
tracing, each epoch's held-out evaluation included) to the end of the first epoch whose
held-out accuracy reaches the job's fixed target (`heldout_jobs`), as in
`time_to_accuracy_heldout.py` (its `Curve`, whose stop at the target is the only change to
the recipe); a run is cut at `--cap` seconds (not reached: infinitely slow). Settings are
interleaved by seed, their order rotated each seed. Per job: each setting's median seconds;
the best fixed setting (lowest median); the paired ratio auto / best per seed, as its median
and a bootstrap 90 % interval over seeds (below 1: auto is faster); what auto chose and why
(the settings table's `dtype_policy` and `jit_compile` rows after the fit); and the share of
the Trainer's start-up clock (`trainer.startup`, as `startup.py` reads it) spent in the
"precision and XLA choice" lap. The online XLA A/B (`tfaccel/choices/online.py`) runs during
the first loops, so its cost is in the time to target, not in that lap.

Writes `benchmarks/results/choices_time_to_accuracy.json` with the host's load average and
the commit. Run: `python benchmarks/choices_time_to_accuracy.py [--jobs ...] [--seeds 3]
[--settings auto float32/xla_off ...] [--cap 120] [--merge]`.
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import pathlib
import time

import heldout_jobs
import keras
import numpy as np
import tensorflow as tf
from time_to_accuracy import epochs_to, time_to
from time_to_accuracy_heldout import Curve, _code, _int_keys, _interval, _ratio

import tfaccel
from tfaccel import precision

OUT = pathlib.Path(__file__).parent / "results" / "choices_time_to_accuracy.json"
HOST = ["shared with other work (a busy host)"]  # what --host says of the machine
AUTO = "auto"
CHOICE_LAP = "precision and XLA choice"


def fixed_settings() -> tuple[list[str], str]:
    """The fixed settings this host offers (`policy/xla_off|on`) and why these policies."""
    offered, why = precision.candidates()
    policies = ["float32"] + (["mixed_bfloat16"] if "mixed_bfloat16" in offered else [])
    return [f"{p}/xla_{x}" for p in policies for x in ("off", "on")], why


def arguments(setting: str) -> dict:
    """The Trainer's `precision` and `jit_compile` for a setting's name."""
    if setting == AUTO:
        return {"precision": "auto", "jit_compile": "auto"}
    policy, xla = setting.split("/")
    return {"precision": policy, "jit_compile": xla == "xla_on"}


def run(job, parts, setting: str, seed: int, cap: float) -> dict:
    """Trains the job's recipe under one setting; its curve, choices and start-up laps."""
    keras.mixed_precision.set_global_policy("float32")  # no policy leaks between runs
    keras.utils.set_random_seed(seed)
    model = job.build()
    train, val, optimizer, callbacks = job.recipe.inputs(parts, seed)
    gc.collect()  # the previous run's garbage, collected outside every run's clock
    start = time.perf_counter()
    curve = Curve(start, job.target, cap)
    try:
        trainer = tfaccel.Trainer(
            model, optimizer=optimizer, loss=job.loss, metrics=["accuracy"], **arguments(setting)
        )
        trainer.fit(
            train,
            epochs=job.recipe.epochs,
            validation_data=val,
            callbacks=[*callbacks, curve],
            verbose=0,
        )
    except Exception as error:  # noqa: BLE001 - a setting's failure is a result
        return {"error": f"{type(error).__name__}: {error}"[:400], "curve": curve.points}
    finally:
        keras.mixed_precision.set_global_policy("float32")
    clock = trainer.startup.to_dict() if trainer.startup is not None else {}
    total, phases = clock.get("total_s", math.nan), clock.get("phases_s", {})
    choice = phases.get(CHOICE_LAP, math.nan)
    return {
        "curve": curve.points,
        "dtype_policy": str(trainer.settings.get("dtype_policy")),
        "jit_compile": str(trainer.settings.get("jit_compile")),
        "policy_used": trainer.model.dtype_policy.name,
        "xla_used": bool(trainer.jit_compile),
        "xla_online": bool(getattr(trainer.jit_choice, "online", False)),
        "startup_s": total,
        "choice_s": choice,
        "choice_share": choice / total if total else math.nan,
    }


def row(job, by_setting: dict, setting: str, seeds: list[int]) -> dict | None:
    results = [by_setting.get(setting, {}).get(s) for s in seeds]
    if any(r is None for r in results):
        return None
    times = [math.inf if "error" in r else time_to(r["curve"], job.target) for r in results]
    out = {
        "seconds": times,
        "seconds_median": float(np.median(times)),
        "epochs": [epochs_to(r["curve"], job.target) for r in results],
        "reached": sum(math.isfinite(t) for t in times),
        "choice_share": [r.get("choice_share") for r in results],
        "startup_s": [r.get("startup_s") for r in results],
    }
    errors = [r["error"] for r in results if "error" in r]
    if errors:
        out["errors"] = errors
    if setting == AUTO:
        out["chose"] = [
            {k: r.get(k) for k in ("policy_used", "xla_used", "xla_online")} for r in results
        ]
        out["why"] = [{k: r.get(k) for k in ("dtype_policy", "jit_compile")} for r in results]
    return out


def summarize(runs: dict, seeds: list[int], settings: list[str]) -> dict:
    """Per job: each setting's times, the best fixed one, and auto / best paired by seed."""
    rng, table = np.random.default_rng(0), {}
    for name, by_setting in runs.items():
        job = heldout_jobs.JOBS[name]
        rows = {s: row(job, by_setting, s, seeds) for s in settings}
        rows = {s: r for s, r in rows.items() if r is not None}
        fixed = {s: r for s, r in rows.items() if s != AUTO}
        entry: dict = {"target": job.target, "settings": rows}
        if AUTO in rows and fixed:
            best = min(fixed, key=lambda s: (fixed[s]["seconds_median"], s))
            pairs = zip(rows[AUTO]["seconds"], fixed[best]["seconds"], strict=True)
            entry["best_fixed"] = best
            entry["auto/best_fixed"] = _interval([_ratio(a, b) for a, b in pairs], rng)
            auto, ended = rows[AUTO]["seconds"], [_name(c) for c in rows[AUTO]["chose"]]
            same = [  # auto over the fixed setting it ended in, same seed: the choosing's cost
                _ratio(auto[i], fixed[e]["seconds"][i]) if e in fixed else math.nan
                for i, e in enumerate(ended)
            ]
            entry["auto/its_choice_fixed"] = _interval(same, rng)
        table[name] = entry
    return table


def show(table: dict, seeds: list[int]) -> str:
    """Markdown: a row per job: auto / best fixed, the seconds, what auto chose."""

    def x(v: float) -> str:
        return "—" if math.isnan(v) else "∞" if not math.isfinite(v) else f"{v:.2f}"

    def span(r: dict | None) -> str:
        return f"{x(r['median'])} [{x(r['low'])}, {x(r['high'])}]" if r else "not run"

    lines = [
        "| job | auto / best fixed | best fixed | auto / the fixed setting it chose "
        "| seconds: auto; each fixed (median) | auto chose (per seed) "
        "| choice lap / start-up (auto) |",
        "|" + " --- |" * 7,
    ]
    for name, entry in table.items():
        rows = entry["settings"]
        ratio, own = (span(entry.get(k)) for k in ("auto/best_fixed", "auto/its_choice_fixed"))
        auto = rows.get(AUTO)
        fixed = "; ".join(
            f"{s} {x(v['seconds_median'])} ({v['reached']}/{len(seeds)})"
            for s, v in rows.items()
            if s != AUTO
        )
        seconds = f"{x(auto['seconds_median'])} ({auto['reached']}/{len(seeds)}); " if auto else ""
        chose = ", ".join(_picked(p) for p in (auto["chose"] if auto else []))
        shares = [s for s in (auto or {}).get("choice_share", []) if s is not None]
        share = f"{100 * float(np.median(shares)):.1f} %" if shares else "—"
        best = entry.get("best_fixed", "—")
        cells = [name, ratio, best, own, f"{seconds}{fixed}", chose, share]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _name(pick: dict) -> str:
    """The fixed setting's name for what auto ended in."""
    return f"{pick['policy_used']}/xla_{'on' if pick['xla_used'] else 'off'}"


def _picked(pick: dict) -> str:
    return f"{pick['policy_used']}+{'XLA' if pick['xla_used'] else 'no XLA'}"


def main() -> None:
    offered, why = fixed_settings()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--jobs", nargs="*", default=list(heldout_jobs.JOBS), choices=list(heldout_jobs.JOBS)
    )
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument(
        "--settings", nargs="*", default=[AUTO, *offered], help=f"of: {AUTO} {' '.join(offered)}"
    )
    parser.add_argument("--cap", type=float, default=120.0, help="seconds a run may take")
    parser.add_argument("--out", default=str(OUT))
    parser.add_argument("--merge", action="store_true", help="keep --out's runs, add missing")
    parser.add_argument("--host", default="shared with other work (a busy host)")
    args = parser.parse_args()
    HOST[0] = args.host
    unknown = [s for s in args.settings if s not in (AUTO, *offered)]
    if unknown:
        parser.error(f"settings {unknown} not offered on this host ({why}); of {offered}")
    out, seeds = pathlib.Path(args.out), list(range(args.seeds))
    old = json.loads(out.read_text()) if args.merge and out.exists() else {}
    runs = json.loads(json.dumps(old.get("runs", {})), object_hook=_int_keys)
    code, began, loads = _code(), time.perf_counter(), [os.getloadavg()]
    for name in args.jobs:
        job, by_setting = heldout_jobs.JOBS[name], runs.setdefault(name, {})
        parts = job.data()
        for seed in seeds:  # interleaved by seed, the order rotated: drift touches all alike
            turn = seed % len(args.settings)
            for setting in args.settings[turn:] + args.settings[:turn]:
                slot = by_setting.setdefault(setting, {})
                if seed in slot:
                    continue
                slot[seed] = dict(run(job, parts, setting, seed, args.cap), code=code)
                slot[seed].update(load_average=os.getloadavg(), cap_seconds=args.cap)
                seconds = time_to(slot[seed]["curve"], job.target)
                print(
                    f"{name} seed {seed} {setting}: {seconds:.1f} s, "
                    f"{len(slot[seed]['curve'])} epochs {slot[seed].get('error', '')[:120]}",
                    flush=True,
                )
        loads.append(os.getloadavg())
        meta = {"seconds": time.perf_counter() - began, "load_average": loads, "code": code}
        _write(out, old, runs, args, seeds, dict(meta, offered=offered, why=why))


def _write(out, old, runs, args, seeds, now: dict) -> None:
    meta = dict(old.get("meta", {}))
    settings = list(dict.fromkeys([*meta.get("settings", []), *args.settings]))
    meta.update(
        seeds=sorted(set(meta.get("seeds", [])) | set(seeds)),
        settings=settings,
        wall_seconds=meta.get("wall_seconds", 0.0) + now["seconds"],
        load_average_1_5_15=[*meta.get("load_average_1_5_15", []), *now["load_average"]],
        commits=sorted(set(meta.get("commits", [])) | {now["code"]}),
        fixed_offered=now["offered"],
        bf16_why=now["why"],
        cap_seconds=args.cap,
        host=f"{os.cpu_count()} CPU cores; {HOST[0]}",
        tensorflow=tf.__version__,
        keras=keras.__version__,
    )
    table = summarize(runs, meta["seeds"], settings)
    document = {"meta": meta, "jobs": table, "runs": runs}
    out.parent.mkdir(exist_ok=True)
    out.write_text(json.dumps(document, indent=1, default=str))
    print(show(table, meta["seeds"]))


if __name__ == "__main__":
    main()
