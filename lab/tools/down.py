"""``python -m lab down``: remove what runs left behind (everything labelled ``lab.run``)."""

from __future__ import annotations

import argparse

NAME = "down"
HELP = "remove everything labelled lab.run (left-over runs, compose runs)"
DESCRIPTION = (
    "Remove the containers, networks and volumes of lab runs that did not clean up after "
    "themselves (a lab that was killed) and of `docker compose up` runs."
)
EPILOG = "Exit codes: 0 done (also when there was nothing to remove), 1 the engine failed."


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--run", metavar="RUN_ID", help="only this run id (default: every run)")
    p.add_argument(
        "--hosts",
        metavar="LIST|FILE",
        help="on every engine of this --hosts (a run across hosts; default the local engine)",
    )


def plan(args: argparse.Namespace) -> str | None:
    return args.run


def run(run_id: str | None) -> tuple[int, str]:
    from lab.engine.client import connect
    from lab.engine.placement import current, down
    from lab.engine.specs import LABEL

    # Workers first: a swarm's overlay network goes on its manager once nothing uses it.
    clients = [connect(endpoint=h.endpoint) for h in current().hosts]
    removed = sum(down(c, run_id) for c in [*clients[1:], clients[0]])
    return removed, LABEL if run_id is None else f"{LABEL}={run_id}"


def report(result: tuple[int, str]) -> int:
    removed, label = result
    print(f"removed {removed} containers/networks/volumes labelled {label}")
    return 0
