"""``lab up``'s page: the parity verdict as the headline, each rank's (or, under torchrun,
each node's) exit and resources, the containers' peak memory, and each rank's records. From
the run's summary."""

from __future__ import annotations

from ddp.torchfree import Headline, Page, Section, Table, steps_table
from lab.experiments.up.analysis import UpSummary
from lab.experiments.up.result import JOB, UpResult
from lab.report.common import command_line, ranks_section
from lab.report.results import Results
from lab.report.summary import RunSummary, started_at

__all__ = ["page"]

_FILES = [
    ("summary.json", "layout, exits, resources, the verdict"),
    ("topology.yaml", "the topology that ran"),
]


def _resources(result: UpResult) -> Table:
    torchrun = result.plan.launcher == "torchrun"
    rows = []
    for who, code in sorted(result.codes.items()):
        cpu, mib = result.usage.get(who, (None, None))
        where = (
            ",".join(map(str, result.placement.get(who, [])))
            if torchrun
            else (f"node{result.plan.layout.node_of(who)}")
        )
        rows.append([who, where or "-", code, cpu, mib])
    first = ("node", "ranks") if torchrun else ("rank", "node")
    return Table(
        (*first, "exit", "cpu s", "peak rss MiB"),
        rows,
        "per node: torchrun and its workers" if torchrun else "per rank",
    )


def page(summary: UpSummary) -> Results:
    """The page and the run's summary.json fields."""
    result, logs = summary.result, summary.logs
    s = result.sampler
    memory = Table(
        ("container", "peak MiB"),
        [[n, u.peak_mib] for n, u in s.containers.items()],
        f"cgroup, sampled every {s.interval_s:g} s",
    )
    problems: list[str] = []
    sections = [
        Section("Exits and resources", [_resources(result), memory]),
        Section("Per step", [steps_table(logs, "mean loss over the ranks; slowest rank's times")]),
        ranks_section(
            result.run_dir,
            {JOB: {} if result.plan.launcher == "torchrun" else result.codes},
            problems,
        ),
    ]
    step = summary.median_step_ms
    figure = f"{result.plan.layout.world_size} ranks, training {result.training_s:.1f} s" + (
        f", median step {step:.1f} ms" if step is not None else ""
    )
    command = command_line("up")
    made = Page(
        f"lab up: run {result.run_id}",
        Headline(command, result.verdict, figure, result.ok),
        sections,
        problems=problems,
    )
    configs = {JOB: step} if step is not None else {}
    run_summary = RunSummary(
        "up",
        result.run_id,
        command,
        started_at(result.total_s),
        result.total_s,
        figure,
        result.verdict,
        result.ok,
        configs,
    )
    return Results(made, run_summary, list(_FILES), [JOB])
