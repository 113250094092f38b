"""``python -m lab up``: run a topology to its parity verdict and leave nothing behind.

One module, read top to bottom in the order data flows: the plan (pure, validated), the run on
the engine, its result, the analysis (pure: the figures from the collected rank logs, one
summary object), then what is printed, the files and the page, each from that summary alone;
last the command's flags and :func:`report`. Parity is re-judged from the collected logs, not
taken from a line the ranks print. The shipped topology files are in ``lab/topologies/``.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ddp.torchfree import (
    ConfigRecord,
    Headline,
    Page,
    RankLog,
    Section,
    Table,
    TrainConfig,
    add_train_arguments,
    check_logs,
    config_from_args,
    steps_table,
)
from lab import args as common
from lab.engine.client import NodeFailed, RunTimeout, connect
from lab.engine.cluster import Cluster
from lab.engine.events import Event, LineEvent, RecordEvent
from lab.engine.job import Job
from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE, new_run_id
from lab.engine.stats import ResourceSampler
from lab.progress import Progress, follow_steps
from lab.report.common import command_line, job_logs, median_step_ms, ranks_section
from lab.report.publish import publish
from lab.report.results import Results
from lab.report.summary import RunSummary, started_at

__all__ = [
    "JOB",
    "LAUNCHERS",
    "TOPOLOGIES",
    "Topology",
    "UpPlan",
    "UpResult",
    "UpSummary",
    "add_arguments",
    "analyse",
    "failure_message",
    "format_summary",
    "load_topology",
    "page",
    "plan",
    "report",
    "run",
    "summary_dict",
    "write_files",
]

# The plan: a layout, the training config and the run's bounds, validated. Topology files
# give name, nodes, ranks_per_node and a train mapping of TrainConfig fields; flags override
# the file. Pure: a bad file fails before any container exists.

LAUNCHERS = ("file", "torchrun")

TOPOLOGIES = Path(__file__).resolve().parents[1] / "topologies"  # lab/topologies/
_KEYS = {"name", "nodes", "ranks_per_node", "train"}
# Set by lab for every rank (the job's directory, records on stdout): not a file's business.
_LAB_OWNS = {"log_dir", "emit_records", "checkpoint_dir"}


@dataclass(frozen=True)
class Topology:
    layout: Layout = field(default_factory=Layout)
    train: TrainConfig = field(default_factory=TrainConfig)
    name: str = ""

    @classmethod
    def from_dict(cls, data: Any, source: str = "topology") -> Topology:
        """Build from parsed YAML, rejecting unknown keys so typos do not pass silently."""
        if not isinstance(data, dict):
            raise ValueError(
                f"{source}: expected a mapping at top level, got {type(data).__name__}"
            )
        unknown = sorted(set(data) - _KEYS)
        if unknown:
            raise ValueError(
                f"{source}: unknown key(s) {', '.join(map(str, unknown))}; known: "
                f"{', '.join(sorted(_KEYS))}"
            )
        train = data.get("train") or {}
        if not isinstance(train, dict):
            raise ValueError(f"{source}: 'train' must be a mapping, got {type(train).__name__}")
        owned = sorted(set(train) & _LAB_OWNS)
        if owned:
            raise ValueError(f"{source}: train: {', '.join(owned)} are set by lab, not by files")
        try:
            layout = Layout(data.get("nodes", 4), data.get("ranks_per_node", 1))
            return cls(
                layout,
                TrainConfig.from_dict(train, f"{source}: train"),
                str(data.get("name") or ""),
            )
        except ValueError as e:
            raise ValueError(e if str(e).startswith(source) else f"{source}: {e}") from None


def load_topology(path: str | Path) -> Topology:
    """Parse and validate a topology YAML file."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"cannot read topology file {path}: {e.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as e:
        raise ValueError(f"{path}: not valid YAML: {e}") from None
    return Topology.from_dict(data, source=str(path))


@dataclass(frozen=True)
class UpPlan:
    """One ``lab up`` run."""

    layout: Layout = field(default_factory=Layout)
    train: TrainConfig = field(default_factory=TrainConfig)
    name: str = ""
    image: str = DEFAULT_IMAGE
    run_timeout_s: float = 600.0
    runs_dir: Path = Path("runs")
    progress: bool = True
    launcher: str = "file"  # one of LAUNCHERS

    def __post_init__(self) -> None:
        if self.launcher not in LAUNCHERS:
            raise ValueError(
                f"--launcher must be one of {', '.join(LAUNCHERS)}, got {self.launcher!r}"
            )
        self.train.local_batch(self.layout.world_size)  # the batch must split over the ranks
        if not self.run_timeout_s > 0:
            raise ValueError(f"--run-timeout must be > 0 seconds, got {self.run_timeout_s!r}")
        if not self.name:
            object.__setattr__(self, "name", self.layout.name)


# What a run produced, as plain data: exits, resources, the verdict re-judged from the
# collected logs; the report and its tests build on it without a run.

JOB = "train"  # the job's name: runs/<run-id>/train/


@dataclass
class UpResult:
    plan: UpPlan
    run_id: str
    run_dir: Path
    codes: dict[int, int]
    usage: dict[int, tuple[float | None, float | None]]  # rank -> (CPU s, peak RSS MiB)
    holds: bool
    verdict: str
    training_s: float  # from the first rank's set-up record to the last exit
    total_s: float  # containers created to removed
    sampler: ResourceSampler
    # node -> the ranks that reported from it (torchrun assigns them; file: the layout's)
    placement: dict[int, list[int]] = dataclasses.field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return self.holds and all(code == 0 for code in self.codes.values())


# The run: one training job on a fresh cluster, followed through its records. The cluster's
# context manager collects every node's output and the job's logs into runs/<run-id>/train/
# and removes everything of the run, also on errors and Ctrl-C.

_FAIL_GRACE_S = 10.0  # after a rank fails, how long the others get to say what they saw


def _show(
    progress: Progress, placement: dict[int, list[int]], per_node: bool
) -> Callable[[Event], None]:
    """Every rank's lines under one prefix (one per node under torchrun); rank 0's step records
    move the progress; set-up records tell which ranks landed on which node."""

    steps = follow_steps(progress)

    def show(event: Event) -> None:
        if isinstance(event, RecordEvent) and isinstance(event.record, ConfigRecord):
            ranks = placement.setdefault(event.node, [])
            if event.record.rank not in ranks:
                ranks.append(event.record.rank)
        if isinstance(event, LineEvent):
            who = f"node{event.node}"
            if event.rank is not None and not per_node:  # torchrun: one stream per node
                who += f"/rank{event.rank}"
            progress.write(f"[{who}] {event.text}")
            return
        steps(event)

    return show


def failure_message(job: Job) -> str:
    """Why a job ended early: the first failed rank's last lines, then the others'."""
    codes = job.codes
    failed = [r for r, c in codes.items() if c != 0]
    if not failed:
        return f"ranks {job.running} never finished"
    first = min(failed, key=lambda r: job.exits[r].t)
    lines = [
        f"rank {first} exited early with code {codes[first]}"
        + (f" while ranks {job.running} were still running" if job.running else "")
        + f"; its last lines:\n{job.last_lines(first, 15)}"
    ]
    # The survivors often say more than the rank that died (e.g. which peer went missing).
    for rank in failed:
        if rank != first:
            lines.append(
                f"  rank {rank} exited with code {codes[rank]}:\n{job.last_lines(rank, 3)}"
            )
    if job.tails.get(None):
        lines.append(f"  node messages:\n{job.last_lines(None, 15)}")
    lines.append(
        "Fix the cause above; if the image is stale, rebuild it with `python -m lab image`"
    )
    return "\n".join(lines)


def run(plan: UpPlan, echo: Callable[[str], None] = print) -> UpResult:
    """Start, train, collect into ``runs_dir/<run-id>/``, check parity; always clean up."""
    client = connect()
    started = time.monotonic()
    progress = Progress(plan.train.steps, enabled=plan.progress, echo=echo)
    run_id = new_run_id()
    run_dir = plan.runs_dir / run_id
    cluster = Cluster(
        client,
        plan.layout,
        image=plan.image,
        run_id=run_id,
        run_dir=run_dir,
        lifetime_s=plan.run_timeout_s + 300,
        echo=echo,
    )
    echo(
        f"run {run_id}: {plan.name} = {plan.layout.describe()}, image {plan.image}, "
        f"output in {run_dir}/"
    )
    sampler: ResourceSampler | None = None
    placement: dict[int, list[int]] = {}
    try:
        with cluster:
            sampler = ResourceSampler(cluster.nodes).start()
            show = _show(progress, placement, plan.launcher == "torchrun")
            if plan.launcher == "torchrun":
                job = cluster.torchrun(JOB, plan.train, plan.run_timeout_s, echo=show)
            else:
                job = cluster.train(JOB, plan.train, plan.run_timeout_s, echo=show)
            running = job.wait(plan.run_timeout_s + 30, fail_grace_s=_FAIL_GRACE_S)
            _write_yaml(run_dir / "topology.yaml", plan)
            _raise_if_unfinished(job, running, plan.run_timeout_s)
    finally:
        progress.close()
        if sampler is not None:
            sampler.stop()
    report = check_logs(run_dir / JOB / "logs")
    trained_from = job.first_record_t or job.started
    return UpResult(
        plan,
        cluster.run_id,
        run_dir,
        job.codes,
        {r: (e.cpu_s, e.peak_rss_mib) for r, e in job.exits.items()},
        report.holds,
        report.verdict,
        max(e.t for e in job.exits.values()) - trained_from,
        time.monotonic() - started,
        sampler,
        {n: sorted(r) for n, r in placement.items()},
    )


def _raise_if_unfinished(job: Job, running: list[int], timeout_s: float) -> None:
    """A rank failed before rank 0 gave its verdict, or the run outlived --run-timeout."""
    if job.verdict is not None and not running:
        return  # finished: parity may still be broken, which the report says
    if any(c != 0 for c in job.codes.values()):
        raise NodeFailed(failure_message(job))
    tails = "\n".join(f"  rank {r}:\n{job.last_lines(r, 3)}" for r in running)
    raise RunTimeout(
        f"run did not finish within {timeout_s:g} s; ranks still running: {running}. Last "
        f"lines:\n{tails}\nRaise --run-timeout for longer runs, or look for a stuck rank above"
    )


def _write_yaml(path: Path, plan: UpPlan) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = {"name": plan.name, **dataclasses.asdict(plan.layout), "train": plan.train.to_dict()}
    path.write_text(yaml.safe_dump(data, sort_keys=False))


# The analysis (pure): the result with the ranks' records and the median step read from them;
# summary.json, the console text and the page are each built from this summary alone.


@dataclass
class UpSummary:
    result: UpResult
    logs: dict[int, RankLog]  # the job's collected records, by rank ({} when unreadable)
    median_step_ms: float | None  # the slowest rank's, median over steps; None: no steps

    @property
    def ok(self) -> bool:
        return self.result.ok


def analyse(result: UpResult) -> UpSummary:
    logs, _ = job_logs(result.run_dir, JOB)  # the page says what is wrong with them
    return UpSummary(result, logs, median_step_ms(logs))


# The closing block printed: per-rank (torchrun: per-node) exits and resources, the verdict.


def _num(value: float | None, width: int, fmt: str) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:{width}{fmt}}"


def _per_rank(result: UpResult) -> list[str]:
    plan = result.plan
    lines = [f"  {'node':<6} {'rank':>4} {'exit':>5} {'cpu s':>7} {'peak rss MiB':>13}  (per rank)"]
    for rank, code in sorted(result.codes.items()):
        cpu, mem = result.usage.get(rank, (None, None))
        lines.append(
            f"  {'node' + str(plan.layout.node_of(rank)):<6} {rank:>4} {code:>5} "
            f"{_num(cpu, 7, '.1f')} {_num(mem, 13, '.0f')}"
        )
    return lines


def _per_node(result: UpResult) -> list[str]:
    """torchrun: one exit per node (its agent's), the ranks its rendezvous put there."""
    lines = [
        f"  {'node':<6} {'ranks':>7} {'exit':>5} {'cpu s':>7} {'peak rss MiB':>13}  "
        "(per node: torchrun and its workers)"
    ]
    for node, code in sorted(result.codes.items()):
        cpu, mem = result.usage.get(node, (None, None))
        ranks = ",".join(map(str, result.placement.get(node, []))) or "-"
        lines.append(
            f"  {'node' + str(node):<6} {ranks:>7} {code:>5} "
            f"{_num(cpu, 7, '.1f')} {_num(mem, 13, '.0f')}"
        )
    return lines


def format_summary(summary: UpSummary) -> str:
    result = summary.result
    plan, s = result.plan, result.sampler
    lines = [
        f"summary of run {result.run_id} ({plan.name}): training {result.training_s:.1f} s, "
        f"total {result.total_s:.1f} s (containers created to removed)",
        *(_per_node(result) if plan.launcher == "torchrun" else _per_rank(result)),
    ]
    peaks = ", ".join(f"{name} {u.peak_mib:.0f} MiB" for name, u in s.containers.items())
    lines.append(f"  peak container memory (cgroup, sampled every {s.interval_s:g} s): {peaks}")
    load = s.mean_host_cpu_percent()
    if load is not None:
        lines.append(f"  host: {os.cpu_count()} CPUs, mean load {load:.0f}% during the run")
    lines.append(
        f"  logs: {result.run_dir}/train/logs/, node output: {result.run_dir}/train/node*.log"
    )
    lines.append(result.verdict)
    return "\n".join(lines)


# summary.json: the layout, exits, resources, the median step and the verdict.


def summary_dict(summary: UpSummary) -> dict:
    result = summary.result
    plan, s = result.plan, result.sampler
    return {
        "run_id": result.run_id,
        "name": plan.name,
        "layout": dataclasses.asdict(plan.layout),
        "train": plan.train.to_dict(),
        "launcher": plan.launcher,  # torchrun: exit codes, cpu and memory are per node
        "placement": {f"node{n}": r for n, r in sorted(result.placement.items())},
        "exit_codes": {str(r): c for r, c in sorted(result.codes.items())},
        "training_s": round(result.training_s, 3),
        "total_s": round(result.total_s, 3),
        "median_step_ms": summary.median_step_ms,
        "parity_holds": result.holds,
        "verdict": result.verdict,
        "containers": {n: dataclasses.asdict(u) for n, u in s.containers.items()},
        "ranks": {
            str(r): {"cpu_s": cpu, "peak_rss_mib": mib}
            for r, (cpu, mib) in sorted(result.usage.items())
        },
        "host_cpus": os.cpu_count(),
        "host_cpu_percent_mean": s.mean_host_cpu_percent(),
    }


def write_files(summary: UpSummary) -> list[Path]:
    """``summary.json`` (the page's common fields are merged into it afterwards)."""
    path = summary.result.run_dir / "summary.json"
    path.write_text(json.dumps(summary_dict(summary), indent=2))
    return [path]


# The page: the verdict as the headline, each rank's (or node's) exit and resources, the
# containers' peak memory, and each rank's records.

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


# The command: its flags, the plan from them, and the report.

NAME = "up"
HELP = "run a topology to its parity verdict, then remove it"
DESCRIPTION = (
    "Start one container per node on a private network with a shared volume, run "
    "`python -m ddp train` on every rank, follow their records (progress bar, per-rank lines), "
    "collect the logs into runs/<run-id>/ and re-judge parity from them. Everything the run "
    "created is removed afterwards, also on errors and Ctrl-C."
)
EPILOG = f"""\
Topology files: {TOPOLOGIES.relative_to(TOPOLOGIES.parents[1])}/*.yaml (nodes, ranks_per_node,
train: any `python -m ddp train` setting); flags override the file.
Files: runs/<run-id>/report.html, summary.json, topology.yaml, tb/train/ (TensorBoard),
train/logs/rank<R>.jsonl, train/node<N>.log.
Exit codes: 0 parity holds and every rank exited 0, 1 parity broken or a rank failed,
2 bad arguments, 130 interrupted."""

_TRAIN_FIELDS: list[str] = []


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--topology", type=Path, help="a topology YAML file (default: 4 nodes x 1)")
    p.add_argument("--nodes", type=common.number(1, kind=int), help="containers (default 4)")
    p.add_argument(
        "--ranks-per-node", type=common.number(1, kind=int), help="ranks per container (default 1)"
    )
    common.add_procs_per_node(
        p, "the same as --ranks-per-node, in torchrun's words (its --nproc-per-node)"
    )
    p.add_argument(
        "--launcher",
        choices=LAUNCHERS,
        default="file",
        help="file: lab starts every rank with its --rank on a file:// rendezvous on the shared "
        "volume; torchrun: one torchrun per node, ranks assigned by its c10d rendezvous on "
        "node 0 (default %(default)s)",
    )
    _TRAIN_FIELDS[:] = add_train_arguments(p, ("train",), keep_unset=True)
    common.add_collective_timeout(p, 300.0, keep_unset=True)
    common.add_run_timeout(p, 600.0, "the whole run")
    common.add_common(p)


def plan(args: argparse.Namespace) -> UpPlan:
    base = load_topology(args.topology) if args.topology else Topology()
    per_node = args.ranks_per_node
    if args.procs_per_node is not None:
        if per_node is not None and per_node != args.procs_per_node:
            raise ValueError("--ranks-per-node and --procs-per-node differ: pass one of them")
        per_node = args.procs_per_node
    layout = Layout(
        args.nodes if args.nodes is not None else base.layout.nodes,
        per_node if per_node is not None else base.layout.ranks_per_node,
    )
    train = config_from_args(args, [*_TRAIN_FIELDS, "collective_timeout_s"], base.train)
    same_layout = layout == base.layout
    return UpPlan(
        layout,
        train,
        base.name if same_layout else "",
        args.image,
        args.run_timeout,
        args.runs_dir,
        args.progress,
        args.launcher,
    )


def report(result: UpResult) -> int:
    summary = analyse(result)
    write_files(summary)
    made = page(summary)  # its summary's common fields merge into summary.json
    for line in publish(result.run_dir, made.page, made.summary, made.files, made.jobs):
        print(line)
    print(format_summary(summary))
    return 0 if summary.ok else 1
