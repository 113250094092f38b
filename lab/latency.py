"""``python -m lab latency``: real link latency between containers, and what bucketing and
overlap do about it.

One set of containers serves the whole sweep: they idle (a bounded ``sleep``) while, for each
link delay, :func:`lab.shaping.apply.shaped` delays every packet between them and verifies the
round trip, and every configuration runs as ``python -m ddp train`` exec'd into each node with
its own rendezvous file and log directory. Configurations differ only in bucket cap, overlap and
sync mode: same model, seed, data and steps. The no-sync floor (no communication at all) runs
first in each round; it is what "exposed communication" is measured from. The whole plan runs
``rounds`` times in a row and each configuration's steps are pooled, so a slow drift of the
shared host's load does not favour whichever configuration ran in a quiet minute.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from lab import report, timeline
from lab.cluster import Cluster
from lab.engine import LabError, NodeFailed, RunTimeout, connect, require_image
from lab.report import Row, load_rank_logs, summarize_config
from lab.specs import DEFAULT_IMAGE, resource_name
from lab.sweep import SWEEP_DIR, RunSpec, SweepSettings, plan_sweep, rank_command, run_name

__all__ = [
    "ConfigRun",
    "LinkReport",
    "SweepResult",
    "combine_rounds",
    "default_timeline_cap",
    "describe",
    "run_sweep",
    "write_outputs",
]

_OUTPUT_TAIL = 15


@dataclass
class LinkReport:
    """The verified link of one delay (``shaper`` "none" when nothing was shaped)."""

    ms: float
    shaper: str
    note: str = ""
    line: str = ""
    rtt_p50_ms: float | None = None
    rtt_p90_ms: float | None = None
    baseline_p50_ms: float | None = None


@dataclass
class ConfigRun:
    """One run (one round) of one configuration; ``row`` holds this run's statistics only."""

    spec: RunSpec
    ms: float
    round: int
    log_dir: Path
    row: Row
    exit_codes: dict[int, int]
    seconds: float


@dataclass
class SweepResult:
    run_id: str
    run_dir: Path
    links: list[LinkReport] = field(default_factory=list)
    runs: list[ConfigRun] = field(default_factory=list)
    seconds: float = 0.0


def _address(node_container: object, network: str) -> str:
    node_container.reload()  # type: ignore[attr-defined]
    nets = node_container.attrs["NetworkSettings"]["Networks"]  # type: ignore[attr-defined]
    return nets[network]["IPAddress"]


@contextlib.contextmanager
def _link(cluster: Cluster, settings: SweepSettings, ms: float, lifetime_s: float) -> Iterator:
    from lab.shaping import apply

    if ms == 0 and not settings.rate_mbit:
        yield LinkReport(ms, "none", line="link unshaped (--ms 0): the bridge's own latency")
        return
    network = resource_name(cluster.run_id)
    nodes = [
        apply.Node(
            node.name,
            (lambda argv, i=node.index: cluster.exec(i, list(argv))),
            address=_address(node.container, network),
        )
        for node in cluster.nodes
    ]
    verified = False
    try:
        with apply.shaped(
            nodes, ms, settings.shaper, settings.rate_mbit, max_seconds=lifetime_s
        ) as rep:
            verified = True
            yield LinkReport(
                ms, rep.shaper, rep.note, rep.line(), rep.measured.get("p50_ms"),
                rep.measured.get("p90_ms"), rep.baseline.get("p50_ms"),
            )  # fmt: skip
    except ValueError as e:
        if verified:
            raise  # from the sweep itself, not from the link check
        # probe.verify: the link is not what was asked
        raise LabError(f"link check failed at {ms:g} ms, nothing was measured: {e}") from None


def _exec_all(
    cluster: Cluster, spec: RunSpec, settings: SweepSettings, ms: float, round_: int
) -> dict[int, tuple[int, str]]:
    results: dict[int, tuple[int, str]] = {}

    def run(node: int, rank: int) -> None:
        try:
            results[rank] = cluster.exec(node, rank_command(spec, settings, ms, rank, round_))
        except Exception as e:  # the engine failed us; reported like a crashed rank
            results[rank] = (-1, f"docker exec failed: {e}")

    threads = [
        threading.Thread(target=run, args=(n.index, n.ranks[0]), daemon=True) for n in cluster.nodes
    ]
    for t in threads:
        t.start()
    # The in-container `timeout` ends the ranks first; this bounds the host side too.
    deadline = time.monotonic() + settings.config_timeout_s + 30
    for t in threads:
        t.join(timeout=max(deadline - time.monotonic(), 0.1))
    missing = [n.ranks[0] for n, t in zip(cluster.nodes, threads, strict=True) if t.is_alive()]
    if missing:
        raise RunTimeout(
            f"{spec.label} at {ms:g} ms: ranks {missing} still running after "
            f"{settings.config_timeout_s:g} s; raise --timeout or look for a stuck rank"
        )
    return results


def _tail(text: str) -> str:
    return "\n".join(f"    {line}" for line in text.strip().splitlines()[-_OUTPUT_TAIL:])


def _run_config(
    cluster: Cluster, spec: RunSpec, settings: SweepSettings, ms: float, round_: int, run_dir: Path
) -> ConfigRun:
    from ddp.parity import check_logs

    started = time.monotonic()
    results = _exec_all(cluster, spec, settings, ms, round_)
    name = run_name(spec, ms, round_)
    # collect() also saves each container's own output (nodeN.log: the idle sleep's, empty).
    cluster.collect(run_dir / "logs", paths=(f"{SWEEP_DIR}/{name}",))
    log_dir = run_dir / "logs" / name
    log_dir.mkdir(parents=True, exist_ok=True)
    for rank, (_, out) in results.items():
        (log_dir / f"rank{rank}.out").write_text(out)
    logs = load_rank_logs(log_dir)
    for rank, (code, out) in sorted(results.items()):
        # Exit 1 with an end record: the rank finished and reports parity broken (by design for
        # the no-sync floor). Anything else is a crash, a timeout, or an image without our ddp.
        if code not in (0, 1) or logs.get(rank, {}).get("end") is None:
            hint = " (killed by --timeout)" if code in (124, 137) else ""
            raise NodeFailed(
                f"{spec.label} at {ms:g} ms (round {round_}): rank {rank} exited with code "
                f"{code}{hint} before finishing; its last lines:\n{_tail(out)}\n"
                f"(all output in {log_dir}/; if the image is stale, `python -m lab image`)"
            )
    stats = summarize_config(log_dir, settings.warmup)
    codes = {rank: code for rank, (code, _) in results.items()}
    parity = None
    if not spec.is_floor:
        parity = check_logs(log_dir).holds and all(c == 0 for c in codes.values())
    row = Row(
        ms=ms, config=spec.label, cap_mb=spec.cap_mb, overlap=spec.overlap, calls=stats.calls,
        median_step_ms=stats.median_step_ms, median_comm_ms=stats.median_comm_ms,
        steps_measured=stats.steps_measured, parity=parity,
    )  # fmt: skip
    return ConfigRun(spec, ms, round_, log_dir, row, codes, time.monotonic() - started)


@contextlib.contextmanager
def _quiet(logger: str) -> Iterator[None]:
    # The shaping logs its own report line; the sweep prints it once, in its own order.
    log = logging.getLogger(logger)
    level = log.level
    log.setLevel(logging.WARNING)
    try:
        yield
    finally:
        log.setLevel(level)


def run_sweep(
    settings: SweepSettings,
    image: str = DEFAULT_IMAGE,
    runs_dir: Path = Path("runs"),
    echo: Callable[[str], None] = print,
    on_config: Callable[[ConfigRun, int, int], None] | None = None,
) -> SweepResult:
    """Start the nodes, shape and verify each delay, run every configuration, collect the logs
    into ``runs_dir/<run-id>/logs/<delay>-<configuration>-r<round>/``; always remove the
    containers (also on errors and Ctrl-C)."""
    plan = plan_sweep(settings)
    total = len(plan) * len(settings.ms) * settings.rounds
    # Bounds everything the run leaves running in the nodes, should lab itself die.
    lifetime_s = total * (settings.config_timeout_s + 60) + 600
    client = connect(timeout_s=settings.config_timeout_s + 60)  # silent ranks: long exec reads
    require_image(client, image)
    cluster = Cluster(client, settings.topology(), image, net_admin=True)
    result = SweepResult(cluster.run_id, runs_dir / cluster.run_id)
    started = time.monotonic()
    echo(
        f"run {cluster.run_id}: {settings.nodes} nodes, model {settings.model}, {len(plan)} "
        f"configurations x {settings.rounds} rounds x {settings.steps} steps at "
        f"{', '.join(f'{m:g}' for m in settings.ms)} ms; output in {result.run_dir}/"
    )
    try:
        cluster.start(command=["sleep", f"{lifetime_s:.0f}"])
        done = 0
        for ms in settings.ms:
            with _quiet("lab.shaping"), _link(cluster, settings, ms, lifetime_s) as link:
                if link.note:
                    echo(link.note)
                echo(link.line)
                result.links.append(link)
                for round_ in range(1, settings.rounds + 1):
                    for spec in plan:
                        run = _run_config(cluster, spec, settings, ms, round_, result.run_dir)
                        result.runs.append(run)
                        done += 1
                        if on_config:
                            on_config(run, done, total)
    finally:
        removed = cluster.remove()
        result.seconds = time.monotonic() - started
        echo(f"removed {removed} containers/networks/volumes labelled lab.run={cluster.run_id}")
    return result


def describe(run: ConfigRun, done: int, total: int) -> str:
    """A progress line for one finished configuration."""
    r = run.row
    parity = "" if r.parity is None else f"  parity {'holds' if r.parity else 'BROKEN'}"
    return (
        f"[{done:>2}/{total}] {r.ms:g} ms round {run.round}  {r.config:<27} {r.calls:>3} "
        f"allreduce/step  median step {r.median_step_ms:8.1f} ms{parity}  ({run.seconds:.0f} s)"
    )


def combine_rounds(runs: Sequence[ConfigRun], warmup: int) -> list[Row]:
    """One row per (delay, configuration): steps pooled over its rounds, parity in all."""
    groups: dict[tuple[float, str], list[ConfigRun]] = {}
    for run in runs:
        groups.setdefault((run.ms, run.spec.name), []).append(run)
    rows = []
    for group in groups.values():
        stats = summarize_config([run.log_dir for run in group], warmup)
        parities = [run.row.parity for run in group]
        rows.append(
            dataclasses.replace(
                group[0].row,
                calls=stats.calls,
                median_step_ms=stats.median_step_ms,
                median_comm_ms=stats.median_comm_ms,
                steps_measured=stats.steps_measured,
                parity=None if None in parities else all(parities),
            )
        )
    return rows


def default_timeline_cap(rows: Sequence[Row], ms: float) -> float | None:
    """The fastest bucketed cap with overlap on at ``ms``: the configuration a user would pick,
    shown beside the same cap with overlap off."""
    bucketed = [r for r in rows if r.ms == ms and r.cap_mb and r.overlap]
    if not bucketed:
        bucketed = [r for r in rows if r.ms == ms and r.cap_mb is not None]
    best = min(bucketed, key=lambda r: r.median_step_ms, default=None)
    return None if best is None else best.cap_mb


@dataclass
class Outputs:
    rows: list[Row]
    headlines: list[report.Headline]
    files: list[Path]


def write_outputs(result: SweepResult, settings: SweepSettings) -> Outputs:
    """CSV, JSON, the sweep plot, and at the largest delay a Chrome trace of every allreduce
    configuration's representative step and a Gantt chart of the timeline cap, overlap on/off."""
    run_dir = result.run_dir
    rows = report.derive_rows(combine_rounds(result.runs, settings.warmup))
    delays = list(dict.fromkeys(r.ms for r in rows))
    headlines = [report.headline(rows, ms) for ms in delays]
    files = [run_dir / "latency.csv", run_dir / "latency.png"]
    report.write_csv(files[0], rows)
    report.plot_sweep(files[1], rows)

    ms = max(delays, default=None)
    cap = settings.timeline_cap
    if cap is None and ms is not None:
        cap = default_timeline_cap(rows, ms)
    traced = [r for r in result.runs if r.ms == ms and r.round == 1 and not r.spec.is_floor]
    steps = {}
    if traced:
        lines = []
        for run in traced:
            step = timeline.representative_step(run.log_dir, settings.warmup)
            steps[run.spec.name] = step
            lines.append(timeline.load_step(run.log_dir, step, f"{ms:g} ms, {run.spec.label}"))
        trace = run_dir / "trace.json"
        trace.write_text(json.dumps(timeline.chrome_trace(lines)))
        pair = [tl for run, tl in zip(traced, lines, strict=True) if run.spec.cap_mb == cap]
        gantt = run_dir / "gantt.png"
        timeline.write_gantt(
            gantt, pair, suptitle=f"one step at {ms:g} ms link delay, {settings.nodes} ranks"
        )
        files += [trace, gantt]
    files.append(run_dir / "latency.json")
    report.write_json(
        files[-1],
        rows,
        headlines,
        {
            "run_id": result.run_id,
            "settings": {**asdict(settings), "ms": list(settings.ms), "caps": list(settings.caps)},
            "links": [asdict(link) for link in result.links],
            "timeline": {"ms": ms, "cap_mb": cap, "steps": steps},
            "runs": [
                {
                    "name": run_name(run.spec, run.ms, run.round),
                    "seconds": round(run.seconds, 1),
                    "exit_codes": run.exit_codes,
                    "median_step_ms": run.row.median_step_ms,
                }
                for run in result.runs
            ],
            "seconds": round(result.seconds, 1),
            "files": [f.name for f in files],
        },
    )
    return Outputs(rows, headlines, files)
