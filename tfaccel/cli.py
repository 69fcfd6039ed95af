"""The `tfaccel` command."""

from __future__ import annotations

import argparse
import json
import sys


def _devices(args: argparse.Namespace) -> int:
    from tfaccel import devices

    report = devices.describe()
    if args.json:
        print(json.dumps(report, indent=2, default=str))
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
    width = max(len(name) for name, _ in rows)
    lines = [f"{name:<{width}}  {value}" for name, value in rows]
    if report["no_gpu_reasons"]:
        lines.append("No GPU is visible. Likely reasons:")
        lines.extend(f"  - {reason}" for reason in report["no_gpu_reasons"])
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="tfaccel", description="Fast Keras training on GPUs and clusters."
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND")
    devices = commands.add_parser("devices", help="report devices, versions, and why no GPU")
    devices.add_argument("--json", action="store_true", help="print JSON instead of a table")
    devices.set_defaults(handler=_devices)
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
