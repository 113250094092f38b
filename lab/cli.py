"""``python -m lab``: image, up, down, parity.

python -m lab image --offline --base-image lab-base:offline
python -m lab up --nodes 4 --steps 20
python -m lab up --topology lab/topologies/2x2.yaml
python -m lab parity runs/<run-id>
python -m lab down
python -m lab kill --rank 2 --at-step 5 --mode pause --timeout 30
python -m lab latency --ms 5
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from pathlib import Path

from lab import kill_cli, latency_cli
from lab.specs import DEFAULT_IMAGE
from lab.topology import MODELS, SYNC_MODES, Topology, load_topology

__all__ = ["build_parser", "main", "topology_from_args"]

_DEFAULT_TOPOLOGY = Topology()


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m lab",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    image = sub.add_parser("image", help="build the lab image (registry, or --offline)")
    image.add_argument(
        "--offline",
        action="store_true",
        help="pip download wheels on the host, build with no network inside",
    )
    image.add_argument(
        "--base-image",
        default="python:3.11-slim",
        help="base image with python3 (default %(default)s)",
    )
    image.add_argument("--tag", default=DEFAULT_IMAGE, help="image tag (default %(default)s)")
    image.add_argument(
        "--torch-index-url",
        default="https://download.pytorch.org/whl/cpu",
        help="registry builds: index of CPU torch wheels (default %(default)s)",
    )
    image.add_argument(
        "--wheelhouse",
        type=Path,
        default=Path("docker/wheelhouse"),
        help="offline builds: wheel directory inside the repo (default %(default)s)",
    )

    up = sub.add_parser("up", help="run a topology to its parity verdict, then remove it")
    up.add_argument("--topology", type=Path, help="topology YAML (lab/topologies/*.yaml)")
    up.add_argument("--nodes", type=int, help=f"containers (default {_DEFAULT_TOPOLOGY.nodes})")
    up.add_argument("--ranks-per-node", type=int, help="ranks per container (default 1)")
    up.add_argument("--steps", type=int, help="optimizer steps (default 20)")
    up.add_argument("--batch-size", type=int, help="global batch (default 64)")
    up.add_argument("--bucket-cap-mb", type=float, help="bucket cap in MB; 0 = per parameter")
    up.add_argument(
        "--no-overlap",
        dest="overlap",
        action="store_false",
        default=None,
        help="reduce buckets after backward instead of during it",
    )
    up.add_argument("--model", choices=MODELS, help="model (default mini)")
    up.add_argument("--seed", type=int, help="init and data seed (default 0)")
    up.add_argument(
        "--sync",
        choices=SYNC_MODES,
        help="'barrier' skips the allreduce: replicas drift, parity breaks",
    )
    up.add_argument("--image", default=DEFAULT_IMAGE, help="image (default %(default)s)")
    up.add_argument(
        "--timeout",
        type=_positive_float,
        default=600.0,
        help="seconds the whole run may take before it is stopped (default 600)",
    )
    up.add_argument(
        "--runs-dir",
        type=Path,
        default=Path("runs"),
        help="where runs/<run-id>/ go (default %(default)s)",
    )
    up.add_argument(
        "--no-progress", dest="progress", action="store_false", help="no progress bar (logs, CI)"
    )

    down = sub.add_parser("down", help="remove everything labelled lab.run (left-over runs)")
    down.add_argument("--run", help="only this run id")

    parity = sub.add_parser("parity", help="re-check a collected run offline")
    parity.add_argument("run_dir", type=Path, help="runs/<run-id> (or its logs/ directory)")

    latency_cli.add_parser(sub)
    kill_cli.add_parser(sub)
    return parser


def topology_from_args(args: argparse.Namespace) -> Topology:
    """The topology file (or the defaults) with every given flag applied on top."""
    base = load_topology(args.topology) if args.topology else _DEFAULT_TOPOLOGY
    return base.with_overrides(
        nodes=args.nodes, ranks_per_node=args.ranks_per_node, steps=args.steps,
        batch_size=args.batch_size, bucket_cap_mb=args.bucket_cap_mb, overlap=args.overlap,
        model=args.model, seed=args.seed, sync=args.sync,
    )  # fmt: skip


def _image(args: argparse.Namespace) -> int:
    from lab.engine import connect
    from lab.image import build_image, download_wheels, probe_base

    client = connect(timeout_s=3600)  # a build step may print nothing for minutes
    wheelhouse = None
    if args.offline:
        base = probe_base(client, args.base_image)
        print(
            f"base image {args.base_image}: Python {base.python}, {base.machine}, "
            f"glibc {base.glibc[0]}.{base.glibc[1]}; downloading wheels into {args.wheelhouse}/"
        )
        wheels = download_wheels(base, args.wheelhouse)
        print(f"{len(wheels)} wheels in {args.wheelhouse}/; building with no network")
        wheelhouse = args.wheelhouse
    build_image(client, args.tag, args.base_image, wheelhouse, args.torch_index_url)
    print(f"built {args.tag}")
    return 0


def _up(args: argparse.Namespace) -> int:
    from lab.up import format_summary, run_topology

    topology = topology_from_args(args)
    result = run_topology(
        topology,
        image=args.image,
        timeout_s=args.timeout,
        runs_dir=args.runs_dir,
        progress=args.progress,
    )
    print(format_summary(result, topology))
    return 0 if result.ok else 1


def _down(args: argparse.Namespace) -> int:
    from lab.cluster import down
    from lab.engine import connect

    removed = down(connect(), args.run)
    label = "lab.run" if args.run is None else f"lab.run={args.run}"
    print(f"removed {removed} containers/networks/volumes labelled {label}")
    return 0


def _parity(args: argparse.Namespace) -> int:
    from ddp.parity import check_logs

    log_dir = args.run_dir / "logs" if (args.run_dir / "logs").is_dir() else args.run_dir
    report = check_logs(log_dir)
    print(report.table())
    print(report.verdict)
    return 0 if report.holds else 1


_COMMANDS = {
    "image": _image,
    "up": _up,
    "down": _down,
    "parity": _parity,
    "latency": latency_cli.run,
    "kill": kill_cli.run,
}


def main(argv: Sequence[str] | None = None) -> int:
    """Exit codes: 0 success (parity holds), 1 failure, 2 bad arguments, 130 interrupted."""
    from lab.engine import LabError

    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        if args.command == "up":
            topology_from_args(args)  # bad values are argument errors, before any Docker call
        elif args.command == "latency":
            latency_cli.settings_from_args(args)
        elif args.command == "kill":
            kill_cli.plan_from_args(args)
    except ValueError as e:
        parser.error(str(e))
    try:
        return _COMMANDS[args.command](args)
    except (LabError, FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(
            "interrupted; cleaned up (run `python -m lab down` if anything is left)",
            file=sys.stderr,
        )
        return 130
