"""``lab run``'s run: the user's script under torchrun on every node, followed, faulted on cue,
and explained when its steps stop.

One cluster (granted SYS_PTRACE for py-spy, NET_ADMIN when the link is shaped or cut); the
workdir goes into every node through the engine's API (``put_archive``: nothing shared but
the network, so it works across engines); one torchrun per node meets at node 0's c10d
rendezvous and runs the command with torchrun's environment, plus the instrumentation's
(``DDP_INSTRUMENT``: every DDP the script builds reports typed records). The lab follows the
step records, fires the faults whose cue came (:mod:`.cues`), and when no step came for the
hang limit (:mod:`.hang`) or a node failed, it asks every live worker for its flight recorder
(SIGUSR2) and its Python stack (py-spy), says the one line, stops the workers. The cluster's
context manager collects every file and removes everything, on errors and Ctrl-C too.
"""

from __future__ import annotations

import contextlib
import io
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from ddp.torchfree import LogError, instrument_environment, load_dumps, load_run, site_dir
from lab.engine.client import GONE, connect
from lab.engine.cluster import Cluster
from lab.engine.events import Event, ExitEvent, LineEvent, RecordEvent
from lab.engine.job import Job
from lab.engine.specs import job_dir
from lab.engine.training import RDZV_PORT, TORCHRUN_ENV, torchrun_head
from lab.experiments.run.cues import Cues
from lab.experiments.run.hang import HangWatch, explain
from lab.experiments.run.names import JOB
from lab.experiments.run.plan import NODE_WORKDIR, RunPlan, workdir_files
from lab.experiments.run.records import digest_of, step_of
from lab.experiments.run.result import RunResult, StepSeen
from lab.experiments.run.workers import Workers
from lab.measure.counters import sampled

__all__ = ["JOB", "instrument_env", "run"]

_WAIT_SLACK_S = 15.0
_DUMP_GRACE_S = 3.0  # SIGUSR2 -> every live rank's dump on the volume
_STOP_S = 20.0  # workers killed -> torchrun's agents exit
SITE_DIR = "/opt/lab-run-site"  # the instrumentation's sitecustomize in every node
_Echo = Callable[[str], None]


def instrument_env(log_dir: str) -> dict[str, str]:
    """What turns the image's instrumentation on for every Python process of the job: its
    records in ``log_dir`` (the job's directory on the volume) and on stdout, and its
    ``sitecustomize`` first on the path (copied to :data:`SITE_DIR` in every node)."""
    return instrument_environment(log_dir, site=Path(SITE_DIR))


def _copy_site(cluster: Cluster) -> None:
    """The instrumentation's ``sitecustomize.py`` into every node's :data:`SITE_DIR`: the
    file activates ``ddp.instrument`` (in the image) when ``DDP_INSTRUMENT=1``."""
    data = (site_dir() / "sitecustomize.py").read_bytes()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(f"{SITE_DIR.strip('/')}/sitecustomize.py")
        info.size, info.mode = len(data), 0o644
        tar.addfile(info, io.BytesIO(data))
    for node in cluster.nodes:
        node.container.put_archive("/", buf.getvalue())


def _archive(workdir: Path) -> bytes:
    """The workdir as a tar whose top directory is the node's workdir."""
    buf = io.BytesIO()
    files, _ = workdir_files(workdir)
    name = NODE_WORKDIR.strip("/")
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(name)
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        tar.addfile(info)
        for path in files:
            tar.add(path, arcname=f"{name}/{path.relative_to(workdir).as_posix()}", recursive=False)
    return buf.getvalue()


def _copy_workdir(cluster: Cluster, plan: RunPlan, echo: _Echo) -> None:
    data = _archive(plan.workdir)
    for node in cluster.nodes:
        node.container.put_archive("/", data)
    files, size = workdir_files(plan.workdir)
    echo(
        f"copied {plan.workdir} ({len(files)} files, {size / 1e6:.1f} MB) into every node's "
        f"{NODE_WORKDIR}"
    )


def _argvs(cluster: Cluster, plan: RunPlan) -> dict[int, list[str]]:
    """Per node: ``cd`` into the workdir, then torchrun, the command run as given."""
    host = cluster.address(0)
    argvs = {}
    for node in cluster.nodes:
        head = torchrun_head(
            str(plan.nodes),
            str(plan.ranks_per_node),
            f"{host}:{RDZV_PORT}",
            JOB,
            "0",
            "join_timeout=120",
            cluster.address(node.index),
        )
        argvs[node.index] = [
            "sh",
            "-c",
            'cd "$0" && exec "$@"',
            NODE_WORKDIR,
            *head,
            "--no-python",
            *plan.argv,
        ]
    return argvs


class _Follower:
    """The job's echo: every node's lines shown, steps kept and shown as progress."""

    def __init__(self, result: RunResult, echo: _Echo, progress: bool) -> None:
        self.result, self.echo, self.progress = result, echo, progress
        self.watch = HangWatch(result.plan.hang_after_s)
        self._shown = 0.0
        self.last_step: dict[int, int] = {}
        self.ended: set[int] = set()  # ranks that wrote their digest: past training

    def __call__(self, event: Event) -> None:
        if isinstance(event, LineEvent):
            self.echo(f"[node{event.node}] {event.text}")
        elif isinstance(event, RecordEvent):
            self.result.ranks_seen.add(event.record.rank)
            seen = step_of(event.record, event.t)
            if seen is not None:
                self._step(seen)
            digest = digest_of(event.record)
            if digest is not None:
                self.result.digests[event.record.rank] = digest
                self.ended.add(event.record.rank)
        elif isinstance(event, ExitEvent):
            self.echo(f"[node{event.node}] torchrun exited {event.code}")

    def _step(self, seen: StepSeen) -> None:
        self.result.steps.append(seen)
        self.last_step[seen.rank] = max(self.last_step.get(seen.rank, 0), seen.step)
        self.watch.step(time.time(), seen.step_ms / 1e3)
        now = time.monotonic()
        if self.progress and seen.rank == 0 and now - self._shown >= 5.0:
            self._shown = now
            ms = sorted(s.step_ms for s in self.result.steps if s.rank == 0)
            self.echo(f"progress: step {seen.step}, median {ms[len(ms) // 2]:.1f} ms/step")


def _diagnose(
    cluster: Cluster, plan: RunPlan, job: Job, stacks: Workers, quiet_s: float | None
) -> str:
    """Ask every live worker for its flight recorder and its stack; the one line."""
    stacks.find()
    asked = time.time()
    if plan.instrument:
        stacks.request_dumps(f"{job_dir(JOB)}/logs")
    where = stacks.read()
    time.sleep(_DUMP_GRACE_S if plan.instrument else 0.0)
    dumps: dict[int, dict] = {}
    with tempfile.TemporaryDirectory() as tmp:
        cluster.collect(Path(tmp))  # each engine's volume, merged
        logs = Path(tmp) / JOB / "logs"
        if logs.is_dir():
            dumps = load_dumps(logs, newer_than=asked - plan.run_timeout_s)
    codes: dict[int, int] = {}
    live = set(stacks.pids)
    for rank in range(plan.layout.world_size):
        if rank not in live:
            codes[rank] = -1
    line = explain(dumps, where, plan.layout.world_size, exits=codes, quiet_s=quiet_s)
    del job
    return line


def _stop(cluster: Cluster, job: Job, stacks: Workers) -> None:
    """Kill every worker; torchrun's agents then exit and the launchers report."""
    stacks.find()
    stacks.signal("KILL")
    job.wait(_STOP_S)


def _follow(
    cluster: Cluster, plan: RunPlan, job: Job, follower: _Follower, cues: Cues, echo: _Echo
) -> str | None:
    """Until the job ends, stalls or fails; the diagnosis when it did not end well."""
    stacks = Workers(cluster, plan)
    deadline = time.monotonic() + plan.run_timeout_s
    while not job.done and time.monotonic() < deadline:
        event = job.poll()
        cues.fire(event, time.time(), follower.last_step)
        if isinstance(event, ExitEvent) and event.code != 0:
            echo(f"[lab] node{event.node}'s torchrun failed (exit {event.code}): diagnosing")
            line = _diagnose(cluster, plan, job, stacks, None)
            _stop(cluster, job, stacks)
            return line
        quiet = follower.watch.stalled(time.time())
        if follower.ended or cues.suspends_hang(time.time()):
            quiet = None  # the script is past training (shutting down), or stopped by design
        if quiet is not None and not stacks.find():
            follower.watch.step(time.time())  # no worker left: the job is ending, not stuck
            quiet = None
        if quiet is not None:
            echo(
                f"[lab] no step record for {quiet:.1f} s (limit {follower.watch.limit_s:.1f} s): "
                "collecting every rank's flight recorder and stack"
            )
            line = _diagnose(cluster, plan, job, stacks, quiet)
            _stop(cluster, job, stacks)
            return line
    if not job.done:
        echo(f"[lab] --run-timeout {plan.run_timeout_s:g} s passed: diagnosing")
        line = _diagnose(cluster, plan, job, stacks, None)
        _stop(cluster, job, stacks)
        return f"run timeout: {line}"
    return None


@contextlib.contextmanager
def _counted(cluster: Cluster, plan: RunPlan, result: RunResult, echo: _Echo) -> Iterator[None]:
    if plan.nodes < 2:
        yield
        return
    counters: dict[int, str] = {}
    try:
        with sampled(cluster, "eth0-run", plan.run_timeout_s + 120) as counters:
            yield
    except GONE as e:  # a paused or killed node cannot be read: the others' counts stand
        echo(f"warning: eth0 counters of some node not read ({type(e).__name__})")
    result.counters = counters


def run(plan: RunPlan, echo: _Echo = print) -> RunResult:
    """The job on one cluster; collect; always clean up."""
    from lab.experiments.run.requirements import image_for

    client = connect()
    started = time.monotonic()
    image = image_for(client, plan, echo)
    cluster = Cluster(
        client,
        plan.layout,
        image=image,
        lifetime_s=plan.lifetime_s,
        net_admin=plan.net_admin,
        ptrace=True,
        echo=echo,
    )
    cluster.run_dir = run_dir = plan.runs_dir / cluster.run_id
    result = RunResult(plan, cluster.run_id, run_dir, image=image)
    echo(f"run {cluster.run_id}: {plan.describe()}; image {image}; output in {run_dir}/")
    try:
        with cluster, contextlib.ExitStack() as stack:
            _copy_workdir(cluster, plan, echo)
            cues = stack.enter_context(Cues(cluster, plan, result, echo))
            cues.link_at_start()
            stack.enter_context(_counted(cluster, plan, result, echo))
            env = dict(TORCHRUN_ENV)
            if plan.instrument:
                _copy_site(cluster)
                env.update(instrument_env(f"{job_dir(JOB)}/logs"))
            follower = _Follower(result, echo, plan.progress)
            job = cluster.job(
                JOB,
                _argvs(cluster, plan),
                plan.run_timeout_s,
                env=env,
                echo=follower,
                per_node=True,
            )
            result.started = job.started
            cues.start(job.started)
            result.diagnosis = _follow(cluster, plan, job, follower, cues, echo)
            job.wait(_WAIT_SLACK_S)
            result.exits, result.running = job.codes, job.running
            job.close()
    finally:
        result.seconds = time.monotonic() - started
    _from_logs(result)
    return result


def _from_logs(result: RunResult) -> None:
    """The steps and digests from the collected rank logs, where they were written: the live
    stream is shared by a node's workers, whose lines can interleave mid-line (a record then
    lost to the live view), while each rank's file is its own."""
    try:
        logs = load_run(Path(result.run_dir) / JOB / "logs")
    except (LogError, OSError):
        return
    steps, digests = [], {}
    for rank, log in sorted(logs.items()):
        for record in log.records:
            seen = step_of(record, 0.0)
            if seen is not None:
                steps.append(seen)
            digest = digest_of(record)
            if digest is not None:
                digests[rank] = digest
    if steps:
        result.steps = steps
    result.digests.update(digests)
