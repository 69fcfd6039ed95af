"""The `tfaccel` command."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import pathlib

    # what add_subparsers returns: each _add_* function adds its command to it
    Subcommands = argparse._SubParsersAction[argparse.ArgumentParser]


def _devices(args: argparse.Namespace) -> int:
    from tfaccel import devices, strict_json

    report = devices.describe()
    if args.json:
        print(strict_json.dumps(report, indent=2, default=str))
        return 0
    print(format_report(report))
    return 0


def format_report(report: dict) -> str:
    """Renders a `devices.describe()` report as a readable table."""
    rows = [
        ("TensorFlow", report["tensorflow"]),
        ("Keras", report["keras"]),
        ("Python", report["python"]),
        ("Built with CUDA", report["built_with_cuda"]),
        ("CUDA / cuDNN (build)", f"{report['cuda_version']} / {report['cudnn_version']}"),
        ("CUDA_VISIBLE_DEVICES", report["cuda_visible_devices"]),
        ("Physical devices", ", ".join(d["name"] for d in report["physical_devices"])),
        ("Logical devices", ", ".join(d["name"] for d in report["logical_devices"])),
    ]
    for gpu in report["gpus"]:
        rows.append(
            (
                f"GPU {gpu['index']}",
                f"{gpu['name']} (capability {gpu['compute_capability']}, {gpu['memory_mb']} MiB)",
            )
        )
    rows.append(("Cluster", _cluster_text(report.get("cluster") or {"source": "none"})))
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    if report["no_gpu_reasons"]:
        lines.append("No GPU is visible. Likely reasons:")
        lines.extend(f"  - {reason}" for reason in report["no_gpu_reasons"])
    return "\n".join(lines)


def _cluster_text(cluster: dict) -> str:
    if cluster["source"] == "invalid":
        return f"invalid: {cluster['error']}"
    if cluster["source"] == "none":
        return "none (single machine; set by TF_CONFIG or a multi-task Slurm step)"
    return (
        f"{cluster['source']}: {cluster['task_type']} {cluster['task_index']} of "
        f"{cluster['workers']} workers ({', '.join(cluster['addresses'])})"
    )


def _launch(args: argparse.Namespace) -> int:
    if getattr(args, "data_workers", None) is not None:  # a local tf.data service
        from tfaccel.data.service.launched import service_for_job

        workers, args.data_workers = args.data_workers, None
        if workers < 1:
            print(f"tfaccel launch: --data-workers must be >= 1, got {workers}", file=sys.stderr)
            return 2
        with service_for_job(workers):
            return _launch(args)
    from tfaccel.launcher import launch
    from tfaccel.launcher.elastic import Elastic

    command = args.command_args[1:] if args.command_args[:1] == ["--"] else args.command_args
    if args.workers < 1:
        print(f"tfaccel launch: --workers must be >= 1, got {args.workers}", file=sys.stderr)
        return 2
    if not command:
        print(
            "tfaccel launch: no command; usage: tfaccel launch --workers N -- python train.py",
            file=sys.stderr,
        )
        return 2
    try:
        launch.check_arguments(
            command,
            args.workers,
            args.cpus_per_worker,
            args.timeout,
            args.startup_timeout,
            args.max_restarts,
            args.min_workers,
            args.max_workers,
            args.checkpoint_dir,
        )
    except ValueError as error:
        print(f"tfaccel launch: {error}", file=sys.stderr)
        return 2
    except FileNotFoundError as error:
        print(f"tfaccel launch: {error}", file=sys.stderr)
        return launch.NOT_FOUND_STATUS
    return launch.launch(
        command,
        args.workers,
        cpus_per_worker=args.cpus_per_worker,
        timeout_s=args.timeout,
        startup_timeout_s=args.startup_timeout,
        max_restarts=args.max_restarts,
        elastic=Elastic(args.min_workers, args.max_workers, args.checkpoint_dir),
    )


def _run_recipe(
    command: str,
    flag: str,
    missing: str,
    args: argparse.Namespace,
    extra: Sequence[str] = (),
) -> int:
    """Runs `python RECIPE --flag [extra] [recipe args]` for the `tfaccel <command>` commands.

    Returns 2 (with the reason on stderr) when the file is missing, is not a `.py` script
    or its code does not take `flag` (`files.script_flags.declares_flag`: not run at all).
    """
    import pathlib
    import subprocess

    from tfaccel.files.script_flags import declares_flag

    recipe = pathlib.Path(args.recipe)
    if not recipe.is_file():
        print(
            f"tfaccel {command}: no recipe file {str(recipe)!r}; usage: "
            f"tfaccel {command} recipes/digits.py [recipe arguments]",
            file=sys.stderr,
        )
        return 2
    if recipe.suffix != ".py":
        print(
            f"tfaccel {command}: {str(recipe)!r} is not a Python script (expected a .py "
            f"file); usage: tfaccel {command} recipes/digits.py [recipe arguments]",
            file=sys.stderr,
        )
        return 2
    if not declares_flag(recipe, flag):
        print(f"tfaccel {command}: {_no_flag(recipe, flag)} {missing}", file=sys.stderr)
        return 2
    recipe_args = args.recipe_args[1:] if args.recipe_args[:1] == ["--"] else args.recipe_args
    return subprocess.call([sys.executable, str(recipe), flag, *extra, *recipe_args])


def _no_flag(recipe: pathlib.Path, flag: str) -> str:
    """Why `recipe` was not run with `flag`, and the command that fits it if one does."""
    from tfaccel.files.script_flags import declares_flag

    text = (
        f"{recipe} has no {flag} option: its code declares no {flag!r} argument (a mention "
        "in a comment or a docstring, or a longer flag, does not count), so it was not run."
    )
    for other, command in (("--tune-batch-size", "tune-batch-size"), ("--tune", "tune")):
        if other != flag and declares_flag(recipe, other):
            text += f" It takes {other}: tfaccel {command} {recipe}."
    return text


def _tune_batch_size(args: argparse.Namespace) -> int:
    missing = (
        "Add one that calls tfaccel.tuning.find_batch_size and trains with report.best_batch_size."
    )
    return _run_recipe("tune-batch-size", "--tune-batch-size", missing, args)


def _tune(args: argparse.Namespace) -> int:
    missing = (
        "Add one that calls tfaccel.tuning.tune and trains with its batch_size and learning_rate."
    )
    return _run_recipe("tune", "--tune", missing, args)


def _doctor(args: argparse.Namespace) -> int:
    """Runs the script under `tfaccel.doctor.script`, which ends it at its first `fit`
    (diagnosed); a recipe whose code declares `--doctor` runs with it."""
    import pathlib
    import subprocess

    if args.budget is not None and not 0 < args.budget < float("inf"):
        print(
            f"tfaccel doctor: --budget must be a finite number > 0 seconds, got {args.budget}; "
            "e.g. --budget 60",
            file=sys.stderr,
        )
        return 2
    script = pathlib.Path(args.recipe)
    if not script.is_file() or script.suffix != ".py":
        return _run_recipe("doctor", "--doctor", "", args)  # says what is wrong
    recipe_args = args.recipe_args[1:] if args.recipe_args[:1] == ["--"] else args.recipe_args
    runner = [sys.executable, "-m", "tfaccel.doctor.script"]
    budget = [] if args.budget is None else ["--budget", str(args.budget)]
    out = [] if args.out is None else ["--out", args.out]
    return subprocess.call([*runner, *budget, *out, str(script), *recipe_args])


def _check(args: argparse.Namespace) -> int:
    """Runs `tfaccel.check`: the table on stdout, 1 when a check failed."""
    import time

    if args.json is not None:
        import pathlib

        target = pathlib.Path(args.json)
        if target.is_dir() or not target.parent.is_dir():
            where = "is a folder" if target.is_dir() else f"is in no folder ({target.parent})"
            print(
                f"tfaccel check: --json {args.json} {where}; pass a file path in an existing "
                "folder, e.g. --json check.json",
                file=sys.stderr,
            )
            return 2
    from tfaccel import check

    if args.json is not None:
        try:
            check.check_json_path(args.json)
        except ValueError as error:
            print(f"tfaccel check: --json: {error}", file=sys.stderr)
            return 2
    began = time.perf_counter()
    results = check.run(json_path=args.json, verbose=True)
    print(check.format_table(results))
    print(f"tfaccel check took {time.perf_counter() - began:.0f} s", end="")
    print(f"; JSON in {args.json}" if args.json else "")
    return 1 if any(r.status == check.FAILED for r in results) else 0


def _data_service(args: argparse.Namespace) -> int:
    from tfaccel.data.service import server

    try:
        if args.role == "dispatcher":
            if args.host_note:
                server.say_no_authentication("dispatcher")
            workers = [w for w in (args.worker_addresses or "").split(",") if w]
            server.serve_dispatcher(args.port, args.work_dir, workers, args.worker_timeout_ms)
        else:
            if args.host_note:
                server.say_no_authentication("worker")
            server.serve_worker(
                args.dispatcher, args.port, args.host, args.heartbeat_ms, args.accept_functions
            )
    except (server.PortInUseError, ValueError) as error:
        print(f"tfaccel data-service {args.role}: {error}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"tfaccel data-service {args.role}: interrupted (Ctrl-C); stopped", file=sys.stderr)
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(130)  # a server process: TensorFlow's destructors may wait on its peers
    return 0


def _add_data_service(commands: Subcommands) -> None:
    service = commands.add_parser(
        "data-service",
        help="run a tf.data service dispatcher or worker (preprocessing on other processes)",
        description="Runs one server of the tf.data service, for data.pipeline(..., "
        "service='grpc://HOST:PORT'): a dispatcher, then any number of workers pointed at "
        "it, from any scheduler (srun, a Kubernetes pod, a Ray task). The servers listen on "
        "every interface and the service has NO AUTHENTICATION: run it on a trusted "
        "network only.",
    )
    roles = service.add_subparsers(dest="role", metavar="ROLE", required=True)
    dispatcher = roles.add_parser(
        "dispatcher",
        help="the dispatcher: hands the pipeline's work to the workers",
        description="Starts a dispatcher on --port (every interface; no authentication).",
    )
    dispatcher.add_argument("--port", type=int, required=True, help="port to listen on")
    dispatcher.add_argument(
        "--work-dir",
        metavar="D",
        help="journal directory: a dispatcher restarted with the same D recovers its jobs",
    )
    dispatcher.add_argument(
        "--worker-addresses",
        metavar="H:P,...",
        help="the fixed list of workers, needed by static sharding (service_mode='static')",
    )
    dispatcher.add_argument(
        "--worker-timeout-ms", type=int, metavar="MS", help="drop a silent worker after MS"
    )
    worker = roles.add_parser(
        "worker",
        help="a worker: runs the pipelines the dispatcher hands it",
        description="Starts a worker of the dispatcher at --dispatcher (no authentication).",
    )
    worker.add_argument("--dispatcher", required=True, metavar="HOST:P", help="the dispatcher")
    worker.add_argument("--port", type=int, default=0, help="port to listen on (0: any free)")
    worker.add_argument(
        "--host", help="the name clients reach this worker by (default: this machine's name)"
    )
    worker.add_argument("--heartbeat-ms", type=int, metavar="MS", help="report every MS")
    worker.add_argument("--accept-functions", action="store_true", help=argparse.SUPPRESS)
    for parser in (dispatcher, worker):
        parser.add_argument(
            "--quiet", dest="host_note", action="store_false", help=argparse.SUPPRESS
        )
    service.set_defaults(handler=_data_service)


def _add_launch(commands: Subcommands) -> None:
    launch = commands.add_parser(
        "launch",
        help="run a multi-worker job as N local processes",
        description="Runs COMMAND as N local workers, each with its TF_CONFIG (worker 0 is "
        "the chief). Exits non-zero as soon as one worker fails, or, with --max-restarts, "
        "restarts all workers (a Trainer with a checkpoint_dir resumes).",
    )
    launch.add_argument("--workers", type=int, required=True, help="number of workers (>= 1)")
    launch.add_argument("--cpus-per-worker", type=int, help="pin each worker to K cores")
    launch.add_argument("--timeout", type=float, help="stop everything after S seconds")
    launch.add_argument(
        "--data-workers",
        type=int,
        metavar="K",
        help="also run a local tf.data service (a dispatcher and K worker processes) for "
        "the job; data.pipeline(..., service='auto') uses it (TFACCEL_DATA_SERVICE), "
        "numpy_function / py_function preprocessing included",
    )
    launch.add_argument(
        "--startup-timeout",
        type=float,
        default=120.0,
        metavar="S",
        help="once one worker's TensorFlow server is up, stop the job if another has not "
        "started its own within S seconds (default 120)",
    )
    launch.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        metavar="N",
        help="after a worker fails (non-zero exit or a signal), stop all and start them all "
        "again, at most N times; not after a clean exit, a usage error (exit status 2, 126, "
        "127) or a timeout (default 0)",
    )
    launch.add_argument(
        "--min-workers",
        type=int,
        metavar="M",
        help="elastic: when a worker still fails after --max-restarts, continue without it "
        "(from the last checkpoint) while at least M workers remain",
    )
    launch.add_argument(
        "--checkpoint-dir",
        metavar="DIR",
        help="the job's checkpoint_dir, to name the step a re-formed job continues from",
    )
    launch.add_argument(
        "--max-workers",
        type=int,
        metavar="N",
        help="elastic: a job on fewer workers (after --min-workers) grows back to N once it "
        "has saved a new checkpoint (needs --checkpoint-dir)",
    )
    launch.add_argument("command_args", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")
    launch.set_defaults(handler=_launch)


def _add_devices(commands: Subcommands) -> None:
    devices = commands.add_parser("devices", help="report devices, versions, and why no GPU")
    devices.add_argument("--json", action="store_true", help="print JSON instead of a table")
    devices.set_defaults(handler=_devices)


def _add_check(commands: Subcommands) -> None:
    check = commands.add_parser(
        "check",
        help="self-test every hardware-dependent path here (run it first on a GPU machine)",
        description="Checks, on this machine: the devices TensorFlow sees (and why not a "
        "GPU), memory growth, the measured precision choice and a training step in it, "
        "float16 loss scaling skipping an overflowing step, an XLA step, a MirroredStrategy "
        "over all local devices against one device, an all-reduce, device-memory readings "
        "and the doctor's verdict on a planted input-bound job. Prints one table; exits 1 "
        "when a check fails. Keep its JSON with a bug report.",
    )
    check.add_argument("--json", metavar="FILE", help="also write the results as JSON to FILE")
    check.set_defaults(handler=_check)


def _add_tune_batch_size(commands: Subcommands) -> None:
    tune = commands.add_parser(
        "tune-batch-size",
        help="run a recipe with --tune-batch-size (probe, table, plot, train at the best batch)",
        description="Runs `python RECIPE.py --tune-batch-size [recipe arguments]`: the recipe "
        "probes batch sizes with tfaccel.tuning.find_batch_size, prints the table, saves the "
        "plot under runs/<recipe>/ and trains with the best batch and the scaled learning rate.",
    )
    tune.add_argument("recipe", metavar="RECIPE.py", help="a recipe script, e.g. recipes/digits.py")
    tune.add_argument("recipe_args", nargs=argparse.REMAINDER, metavar="...")
    tune.set_defaults(handler=_tune_batch_size)


def _add_tune(commands: Subcommands) -> None:
    both = commands.add_parser(
        "tune",
        help="run a recipe with --tune (the batch size, then the learning rate at it)",
        description="Runs `python RECIPE.py --tune [recipe arguments]`: the recipe tunes the "
        "batch as --tune-batch-size does, then runs a learning-rate range test at that batch "
        "(tfaccel.tuning.tune), prints the arguments to pass (--batch-size B --learning-rate "
        "R, and --one-cycle PEAK for a grown batch's schedule) and trains with them.",
    )
    both.add_argument("recipe", metavar="RECIPE.py", help="a recipe script, e.g. recipes/digits.py")
    both.add_argument("recipe_args", nargs=argparse.REMAINDER, metavar="...")
    both.set_defaults(handler=_tune)


def _add_doctor(commands: Subcommands) -> None:
    doctor = commands.add_parser(
        "doctor",
        help="diagnose what limits a script's training (input, compute, communication, host, "
        "memory) and print the report",
        description="Runs SCRIPT.py (with its arguments) until its first model.fit or "
        "Trainer.fit, and instead of training runs tfaccel.doctor.diagnose on that model and "
        "data for a bounded time, prints the verdict, the measured rates and the ranked fixes "
        "(doctor.json and doctor.png under --out), and ends the process there, whatever "
        "the script catches; the script is not changed. A recipe whose code declares "
        "--doctor (recipes/: common.parser(..., doctor=True)) is run with it.",
    )
    doctor.add_argument(
        "--out", metavar="DIR", help="save doctor.json and doctor.png in DIR (a recipe: its --out)"
    )
    doctor.add_argument(
        "--budget",
        type=float,
        metavar="S",
        help="seconds the diagnosis aims to stay under, tracing included (default: the "
        "doctor's, 60 s or 5%% of an epoch)",
    )
    doctor.add_argument(
        "recipe", metavar="SCRIPT.py", help="a training script, e.g. train.py or recipes/digits.py"
    )
    doctor.add_argument("recipe_args", nargs=argparse.REMAINDER, metavar="...")
    doctor.set_defaults(handler=_doctor)


def build_parser() -> argparse.ArgumentParser:
    """The `tfaccel` parser: one small function adds each sub-command."""
    parser = argparse.ArgumentParser(
        prog="tfaccel", description="Fast Keras training on GPUs and clusters."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    for add in (
        _add_devices,
        _add_check,
        _add_launch,
        _add_tune_batch_size,
        _add_tune,
        _add_doctor,
        _add_data_service,
    ):
        add(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    return args.handler(args)


if __name__ == "__main__":
    sys.exit(main())
