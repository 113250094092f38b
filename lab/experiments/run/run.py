"""``lab run``'s experiment whole: the user's own torch DDP script under torchrun on every node,
on a verified link, faulted on cue, explained when its steps stop, and reported.

One module, read top to bottom in the order data flows: the plan (pure, validated before any
container exists), the result the run hands over and what the step records say, the image (the
script's extra packages), the faults on their cue, the run on the engine, the analysis (pure:
one summary from the result alone), then the files, the page and :func:`report`, each from
that summary. Beside it, each its own idea: the faults as the user writes them
(:mod:`.faults`), the job's workers seen from outside (:mod:`.workers`), and when the steps
stop and what the stuck job says about itself (:mod:`.hang`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import tarfile
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

import docker.errors

import docker
from ddp.torchfree import (
    EndRecord,
    Headline,
    LogError,
    Page,
    Record,
    ScriptEndRecord,
    ScriptStepRecord,
    Section,
    StepRecord,
    Table,
    Text,
    instrument_environment,
    load_dumps,
    load_run,
    site_dir,
    tensorboard_available,
)
from lab.engine.build import platform_tags, probe_base
from lab.engine.client import GONE, LabError, connect, require_image
from lab.engine.cluster import Cluster
from lab.engine.distribute import image_id
from lab.engine.events import Event, ExitEvent, LineEvent, RecordEvent
from lab.engine.job import Job
from lab.engine.layout import Layout
from lab.engine.specs import DEFAULT_IMAGE, job_dir
from lab.engine.training import RDZV_PORT, TORCHRUN_ENV, torchrun_head
from lab.experiments.run.faults import FaultCue
from lab.experiments.run.hang import HangWatch, explain
from lab.experiments.run.workers import Workers
from lab.faults.partition import Partition
from lab.faults.pause import Pause
from lab.measure.counters import sampled
from lab.report.common import command_line, figures_section
from lab.report.publish import TB_DIR, publish
from lab.report.results import Results
from lab.report.summary import RunSummary as Summary
from lab.report.summary import started_at
from lab.shaping.impair import Impairments
from lab.shaping.verified_link import verified_link

__all__ = [
    "EXCLUDED_DIRS",
    "FIGURE",
    "JOB",
    "MAX_WORKDIR_MB",
    "NODE_WORKDIR",
    "RECOVERIES",
    "WHEELHOUSES",
    "Cues",
    "FaultEvent",
    "RunPlan",
    "RunResult",
    "RunSummary",
    "StepSeen",
    "analyse",
    "copy_workdir",
    "derived_tag",
    "digest_of",
    "due",
    "image_for",
    "instrument_env",
    "link_bytes",
    "page",
    "percentile",
    "report",
    "resolve",
    "run",
    "script_of",
    "step_of",
    "workdir_files",
    "write_files",
    "write_scalars",
]

# The plan: the user's command, where it comes from, the layout, the link, the faults.
#
# Pure and validated before any container exists; every refusal is one line naming the flag
# (exit 2): a script that does not exist (or lies outside ``--workdir``, the only directory the
# nodes get), a workdir over MAX_WORKDIR_MB, a requirements file that is missing, a fault aimed
# at a rank or node the layout has not, a step cue without the instrumentation that gives
# steps. Whether a requirements file resolves is asked of pip on the host, before the run too
# (the image, below).

MAX_WORKDIR_MB = 100.0  # copied into every node, through the engine's API, per run
NODE_WORKDIR = "/workdir"  # where the workdir lands in every node, and the script's cwd
# Never copied: version control, caches, environments and the lab's own outputs.
EXCLUDED_DIRS = frozenset(
    {
        ".git",
        "__pycache__",
        ".venv",
        "venv",
        "runs",
        ".pytest_cache",
        ".ruff_cache",
        ".mypy_cache",
        "node_modules",
        "wheelhouse",
        ".tox",
    }
)
_PYTHONS = ("python", "python3")
# torchrun: a lost worker ends the job (today's lab run); live: the script's Manager
# (ddp.recovery.api) goes on without it, on the lab's etcd (.live)
RECOVERIES = ("torchrun", "live")


def script_of(command: tuple[str, ...]) -> str | None:
    """The script a command runs (``python train.py ...`` or ``train.py ...``), None for
    ``python -m module`` and other programs."""
    if not command:
        return None
    if command[0].endswith(".py"):
        return command[0]
    if os.path.basename(command[0]) in _PYTHONS:
        rest = [a for a in command[1:]]
        while rest and rest[0].startswith("-") and rest[0] not in ("-m", "-c"):
            rest = rest[1:]  # python -u train.py
        if rest and rest[0] not in ("-m", "-c"):
            return rest[0]
    return None


def workdir_files(workdir: Path) -> tuple[list[Path], int]:
    """Every file copied into the nodes (regular files, :data:`EXCLUDED_DIRS` left out) and
    their total size in bytes."""
    files, total = [], 0
    for root, dirs, names in os.walk(workdir):
        dirs[:] = sorted(d for d in dirs if d not in EXCLUDED_DIRS and not d.endswith(".egg-info"))
        for name in sorted(names):
            path = Path(root) / name
            if path.is_file() and not path.is_symlink():
                files.append(path)
                total += path.stat().st_size
    return files, total


@dataclass(frozen=True)
class RunPlan:
    """One ``lab run``: ``command`` (after ``--``) under torchrun on ``nodes`` x
    ``ranks_per_node`` workers, from ``workdir``; ``ms``/``rate_mbit``/``impair`` the link
    between the nodes (0 and None: unshaped); ``faults`` on cue; ``hang_after_s`` None: a few
    median steps (:mod:`.hang`)."""

    command: tuple[str, ...]
    workdir: Path = field(default_factory=Path.cwd)
    nodes: int = 2
    ranks_per_node: int = 1
    ms: float = 0.0
    rate_mbit: float | None = None
    impair: Impairments = field(default_factory=Impairments)
    shaper: str = "auto"
    faults: tuple[FaultCue, ...] = ()
    hang_after_s: float | None = None
    requirements: Path | None = None
    instrument: bool = True
    run_timeout_s: float = 600.0
    collective_timeout_s: float = 30.0
    image: str = DEFAULT_IMAGE
    runs_dir: Path = Path("runs")
    progress: bool = True
    max_workdir_mb: float = MAX_WORKDIR_MB
    recovery: str = "torchrun"  # one of RECOVERIES; "live": .live runs it

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError(
                "no command: put it after --, e.g. python -m lab run --nodes 2 -- python train.py"
            )
        if self.recovery not in RECOVERIES:
            raise ValueError(
                f"--recovery must be one of {', '.join(RECOVERIES)}, got {self.recovery!r}"
            )
        if self.live:
            self._check_live()
        self.layout  # noqa: B018 - validates --nodes, --ranks-per-node
        if not self.workdir.is_dir():
            raise ValueError(f"--workdir {self.workdir} is not a directory")
        object.__setattr__(self, "workdir", self.workdir.resolve())
        script = script_of(self.command)
        if script is not None:
            path = (self.workdir / script).resolve()
            if not path.is_file():
                raise ValueError(
                    f"no script {script} in --workdir {self.workdir}: the nodes run the command "
                    "there; pass the workdir that holds it"
                )
            if not path.is_relative_to(self.workdir):
                raise ValueError(
                    f"script {script} lies outside --workdir {self.workdir}, and only the "
                    "workdir is copied into the nodes; pass --workdir of a folder that holds it"
                )
        _, size = workdir_files(self.workdir)
        if size > self.max_workdir_mb * 1e6:
            raise ValueError(
                f"--workdir {self.workdir} holds {size / 1e6:.0f} MB, over the "
                f"{self.max_workdir_mb:g} MB limit (copied into every node): pass "
                "--workdir of the script's own folder, or keep data out of it"
            )
        if self.requirements is not None and not self.requirements.is_file():
            raise ValueError(f"--requirements {self.requirements}: no such file")
        for flag, value in (("--ms", self.ms), ("--run-timeout", self.run_timeout_s)):
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{flag} must be a finite number >= 0, got {value!r}")
        if self.rate_mbit is not None and not self.rate_mbit > 0:
            raise ValueError(f"--rate-mbit must be > 0, got {self.rate_mbit!r}")
        if self.hang_after_s is not None and not self.hang_after_s > 0:
            raise ValueError(f"--hang-after must be > 0 seconds, got {self.hang_after_s!r}")
        if self.shaped and self.nodes < 2:
            raise ValueError("a shaped link needs --nodes 2 or more: it is the link between nodes")
        for cue in self.faults:
            self._check_fault(cue)

    def _check_live(self) -> None:
        """``--recovery live``: one replica per node, its records the Manager's; what it does
        not take is refused here, one line each."""
        if self.ranks_per_node != 1:
            raise ValueError(
                f"--recovery live runs one replica per node: drop --ranks-per-node "
                f"{self.ranks_per_node} (use --nodes for more replicas)"
            )
        if self.nodes < 3:
            raise ValueError(
                f"--recovery live needs --nodes >= 3, got {self.nodes}: after losing one replica "
                "the survivors must be more than half of the quorum to go on"
            )
        if self.shaped:
            raise ValueError(
                "--recovery live runs on the bare link: drop --ms, --rate-mbit, --jitter-ms and "
                "--loss-pct (shape it with the default --recovery torchrun)"
            )
        if self.hang_after_s is not None:
            raise ValueError(
                "--hang-after reads torchrun's workers; under --recovery live a silent replica "
                "is the decider's to drop: drop --hang-after"
            )
        if len(self.faults) > 1:
            raise ValueError("--recovery live takes one --fault (a kill), got several")
        for cue in self.faults:
            if cue.kind != "kill":
                raise ValueError(
                    f"--fault {cue.text}: --recovery live takes kill:rank=R:at-step=N[:rejoin] "
                    f"(or at=SECONDS), not {cue.kind}"
                )
            if cue.at_step is not None and cue.at_step < 2:
                raise ValueError(
                    f"--fault {cue.text}: under --recovery live at-step must be >= 2 (it fires "
                    "when replica R committed step N - 1)"
                )

    def _check_fault(self, cue: FaultCue) -> None:
        if cue.rejoin and not self.live:
            raise ValueError(
                f"--fault {cue.text}: rejoin needs --recovery live (a script whose loop uses "
                "ddp.recovery.api.Manager); under torchrun a killed worker ends the job"
            )
        world = self.layout.world_size
        if cue.rank is not None and not cue.rank < world:
            raise ValueError(
                f"--fault {cue.text}: rank {cue.rank} is out of range, the ranks are 0..{world - 1}"
            )
        if cue.node is not None and not cue.node < self.nodes:
            raise ValueError(
                f"--fault {cue.text}: node {cue.node} is out of range, the nodes are "
                f"0..{self.nodes - 1}"
            )
        if cue.by_step and not self.instrument and not self.live:
            raise ValueError(
                f"--fault {cue.text}: at-step needs the step records, which --no-instrument "
                "turns off; cue it at=SECONDS instead"
            )
        if cue.kind == "partition" and self.nodes < 2:
            raise ValueError(f"--fault {cue.text}: a partition needs --nodes 2 or more")
        if cue.kind == "link" and self.nodes < 2:
            raise ValueError(f"--fault {cue.text}: the link is between nodes: --nodes 2 or more")

    @property
    def layout(self) -> Layout:
        return Layout(self.nodes, self.ranks_per_node)

    @property
    def live(self) -> bool:
        return self.recovery == "live"

    @property
    def shaped(self) -> bool:
        return bool(self.ms or self.rate_mbit or self.impair)

    @property
    def net_admin(self) -> bool:
        """Shaping and partitions change the nodes' network: CAP_NET_ADMIN."""
        return self.shaped or any(c.kind in ("partition", "link") for c in self.faults)

    @property
    def argv(self) -> list[str]:
        """What torchrun runs in every worker (``--no-python``): ``train.py`` alone runs
        under python."""
        cmd = list(self.command)
        return ["python", *cmd] if cmd[0].endswith(".py") else cmd

    @property
    def lifetime_s(self) -> float:
        """The containers' main process outlives the job, the link checks and the diagnosis."""
        return math.ceil(self.run_timeout_s + 300.0)

    def link_text(self, ms: float | None = None) -> str:
        """``5 ms between nodes``, ``an unshaped link``."""
        ms = self.ms if ms is None else ms
        if not (ms or self.rate_mbit or self.impair):
            return "unshaped link" if self.nodes > 1 else "one node"
        rate = f", {self.rate_mbit:g} Mbit/s" if self.rate_mbit else ""
        impair = f", {self.impair.describe()}" if self.impair else ""
        return f"{ms:g} ms between nodes{rate}{impair}"

    def describe(self) -> str:
        world = self.layout.world_size
        faults = "; faults: " + ", ".join(c.describe() for c in self.faults) if self.faults else ""
        if self.live:
            return (
                f"{world} replicas on {world} nodes with live recovery (etcd on 3 nodes, the "
                f"decider on one); `{' '.join(self.command)}` from {self.workdir}{faults}"
            )
        return (
            f"{world} ranks on {self.nodes} nodes, {self.link_text()}; `{' '.join(self.command)}` "
            f"from {self.workdir}{faults}"
        )


# What the run hands to its report: plain data, Docker-free, so the analysis and its tests
# build on synthetic values as well as on a real run.

JOB = "job"  # the run's one job: its name, which is its directory on the volume and in the run


@dataclass(frozen=True)
class StepSeen:
    """One step record as the lab followed it: ``t`` its end (wall clock), ``step_ms`` its
    duration; ``nbytes`` what the rank's allreduces moved in it (None: not reported)."""

    rank: int
    step: int
    t: float
    step_ms: float
    nbytes: int | None = None
    allreduces: int | None = None


@dataclass(frozen=True)
class FaultEvent:
    """A fault landing (or lifting): seconds from the job's start, and what was done."""

    at_s: float
    text: str


@dataclass
class RunResult:
    plan: RunPlan
    run_id: str
    run_dir: Path
    started: float = 0.0  # the job's start, wall clock
    seconds: float = 0.0
    steps: list[StepSeen] = field(default_factory=list)
    exits: dict[int, int] = field(default_factory=dict)  # node -> torchrun's exit code
    running: list[int] = field(default_factory=list)  # nodes still running when it was stopped
    faults: list[FaultEvent] = field(default_factory=list)
    diagnosis: str | None = None  # the one line, when the job hung or failed
    digests: dict[int, str] = field(default_factory=dict)  # rank -> final parameters' digest
    counters: dict[int, str] = field(default_factory=dict)  # node -> eth0 samples ("t tx rx")
    links: list[str] = field(default_factory=list)  # the probe's line per link set
    ranks_seen: set[int] = field(default_factory=set)
    image: str = ""

    @property
    def clean(self) -> bool:
        return not self.running and bool(self.exits) and all(c == 0 for c in self.exits.values())


# What the run takes from the typed records (read by ddp's one reader,
# ddp.torchfree.parse_record_line): the instrumentation's steps of the script's first DDP
# module (``script_step``: its end, duration, allreduces and their bytes) and its final
# parameters' digest (``script_end``); our own wrapper's ``python -m ddp`` records (``step``,
# ``end``) count the same, so a script that trains with it is followed the same way.


def step_of(record: Record, t: float) -> StepSeen | None:
    """The step a record reports (``t``: when the lab saw it, for a record without its own
    end time), or None for any other record (and for a second DDP module's steps)."""
    if isinstance(record, ScriptStepRecord):
        if record.module != 0:
            return None
        return StepSeen(
            record.rank, record.step, record.t1, record.step_ms, record.bytes, record.allreduces
        )
    if isinstance(record, StepRecord):
        end = record.t0 + record.step_ms / 1e3 if record.t0 is not None else t
        return StepSeen(record.rank, record.step, end, record.step_ms, None, record.num_buckets)
    return None


def digest_of(record: Record) -> str | None:
    """The final parameters' sha256 a record carries, else None."""
    if isinstance(record, ScriptEndRecord) and record.module == 0:
        return record.params_sha256
    if isinstance(record, EndRecord):
        return record.params_sha256
    return None


# The image: ``--requirements FILE``, the script's extra packages, built into an image derived
# from the lab image, with no package index needed at run time and none inside the build.
#
# On the host, ``pip download`` fetches wheels for the image's Python and platform (probed by
# running the lab image, as ``lab image --offline`` does) into a wheelhouse cached by the file's
# hash and the lab image's id; then ``FROM <lab image>`` installs them with ``--no-index``, the
# build's network off. The derived image is tagged by the same hash, so a second run with the
# same file and image builds nothing. A file whose packages pip cannot resolve is refused before
# any container exists (exit 2, pip's own last line beside it).

WHEELHOUSES = Path.home() / ".cache" / "ddp-lab" / "wheelhouses"
_DOCKERFILE = """\
ARG BASE
FROM ${BASE}
COPY wheels/ /tmp/wheels/
COPY requirements.txt /tmp/requirements.txt
RUN pip install --no-index --find-links /tmp/wheels -r /tmp/requirements.txt && rm -rf /tmp/wheels
"""


def _key(plan: RunPlan, base_id: str) -> str:
    assert plan.requirements is not None
    h = hashlib.sha256(plan.requirements.read_bytes())
    h.update(base_id.encode())
    return h.hexdigest()[:12]


def derived_tag(image: str, key: str) -> str:
    """``ddp-lab:latest`` + key -> ``ddp-lab:latest-req-<key>``."""
    repo, _, tag = image.rpartition(":") if ":" in image.split("/")[-1] else (image, "", "latest")
    return f"{repo}:{tag}-req-{key}"


def _wheelhouse(client: docker.DockerClient, plan: RunPlan) -> tuple[Path, str]:
    """Download the wheels (cached); (the wheelhouse, the key). ValueError if pip cannot."""
    require_image(client, plan.image)
    base_id = image_id(client, plan.image) or plan.image
    key = _key(plan, base_id)
    house = WHEELHOUSES / key
    if (house / ".complete").is_file():
        return house, key
    base = probe_base(client, plan.image)
    house.mkdir(parents=True, exist_ok=True)
    cmd = [
        sys.executable, "-m", "pip", "download", "--dest", str(house), "--only-binary=:all:",
        "--implementation", "cp", "--python-version", base.python, "-r", str(plan.requirements),
    ]  # fmt: skip
    for tag in platform_tags(base):
        cmd += ["--platform", tag]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        raise ValueError(f"--requirements {plan.requirements}: pip took over 900 s") from None
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise ValueError(
            f"--requirements {plan.requirements} does not resolve for the image's Python "
            f"{base.python} ({base.machine}): {last}"
        )
    (house / ".complete").write_text("")
    return house, key


def resolve(plan: RunPlan) -> None:
    """Before the run: the wheels are there (downloaded now if not); ValueError if not."""
    if plan.requirements is None:
        return
    client = connect()
    try:
        _wheelhouse(client, plan)
    finally:
        client.close()


def _context(house: Path, requirements: Path) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        files = (
            ("Dockerfile", _DOCKERFILE.encode()),
            ("requirements.txt", requirements.read_bytes()),
        )
        for name, data in files:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        tar.add(house, arcname="wheels")
    return buf.getvalue()


def image_for(client: docker.DockerClient, plan: RunPlan, echo: Callable[[str], None]) -> str:
    """The image the run uses: the lab image, or the one derived with the requirements."""
    if plan.requirements is None:
        return plan.image
    house, key = _wheelhouse(client, plan)
    tag = derived_tag(plan.image, key)
    try:
        client.images.get(tag)
        echo(f"image {tag}: {plan.requirements} already built in")
        return tag
    except docker.errors.ImageNotFound:
        pass
    echo(f"image {tag}: building {plan.requirements} into {plan.image} (offline, from {house})")
    stream = client.api.build(
        fileobj=io.BytesIO(_context(house, plan.requirements)),
        custom_context=True,
        tag=tag,
        buildargs={"BASE": plan.image},
        network_mode="none",
        rm=True,
        forcerm=True,
        decode=True,
    )
    for chunk in stream:
        if "error" in chunk:
            raise LabError(f"building {tag} failed: {chunk['error'].strip()}")
    return tag


# The faults (as written: .faults) fired on their cue and lifted on theirs, all undone on the
# way out.
#
# A context manager over the run: node faults are lab.faults' (prepared when the job starts, so
# the injection is one quick call; released whatever happens); a kill SIGKILLs the rank's
# worker process (found by its ``RANK``, .workers), not its container, so torchrun's agent sees
# its worker die; a link cue replaces the verified link with the new one, probed again
# (lab.shaping.verified_link.verified_link): measured and shown, not judged, since the probe's
# echoes then queue behind the job's own traffic. Step cues are matched against the step
# records (rank R's record of step N - 1 for ``kill:rank=R``, rank 0's for the others), time
# cues against the wall clock from the job's start.

_SNAPSHOT_AFTER_S = 0.3  # from a kill to asking the others for their flight recorders
_LINK_SETTLE_S = 15.0  # the probe re-verifies a changed link: no hang verdict meanwhile


def due(cue: FaultCue, event: Event | None, now: float, started: float | None) -> bool:
    """Has ``cue``'s moment come? Pure: a step cue by the record ``event`` carries, a time cue
    by the wall clock ``now`` against the job's start."""
    if cue.at_s is not None:
        return started is not None and now - started >= cue.at_s
    if not isinstance(event, RecordEvent):
        return False
    seen = step_of(event.record, event.t)
    if seen is None:
        return False
    who = cue.rank if cue.kind == "kill" else 0
    assert cue.at_step is not None
    return seen.rank == who and seen.step >= cue.at_step - 1


class Cues:
    def __init__(self, cluster: Cluster, plan: RunPlan, result: RunResult, echo: Callable) -> None:
        self.cluster, self.plan, self.result, self.echo = cluster, plan, result, echo
        self.pending = list(plan.faults)
        self.started: float | None = None
        self.workers = Workers(cluster)
        self._stack = contextlib.ExitStack()
        self._link = contextlib.ExitStack()  # the link now in place
        self._lifts: list[tuple[float, Callable[[], str | None], str]] = []
        self._quiet_until = 0.0

    # --- context ---------------------------------------------------------------------------
    def __enter__(self) -> Cues:
        self._stack.__enter__()
        self._stack.callback(self._link.close)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stack.__exit__(*exc)

    # --- the link --------------------------------------------------------------------------
    def _set_link(self, ms: float, rate_mbit: float | None, *, judge: bool = True) -> str:
        self._link.close()
        # Mid-run (unjudged) every node is re-shaped at once: the job runs on a bare link
        # between the old shaping's undo and the new one's taking effect.
        kw = {"impair": self.plan.impair, "max_seconds": self.plan.lifetime_s, "judge": judge}
        kw["parallel"] = not judge
        where = f"at {ms:g} ms"
        report = self._link.enter_context(
            verified_link(self.cluster, where, ms, self.plan.shaper, rate_mbit, **kw)
        )
        line = report.line()
        self.result.links.append(line)
        return line

    def link_at_start(self) -> None:
        if self.plan.shaped:
            self.echo(self._set_link(self.plan.ms, self.plan.rate_mbit))

    # --- the run ---------------------------------------------------------------------------
    def start(self, started: float) -> None:
        """The job started (wall clock); node faults are prepared now."""
        self.started = started

    def _at(self) -> float:
        return time.time() - (self.started or time.time())

    def _log(self, text: str) -> None:
        at = self._at()
        self.result.faults.append(FaultEvent(round(at, 3), text))
        self.echo(f"[lab] {at:+.2f} s: {text}")

    def suspends_hang(self, now: float) -> bool:
        """A pause or partition with an end, or a link being re-verified: the steps stop by
        design for a while, which is no hang."""
        return now < self._quiet_until

    def fire(self, event: Event | None, now: float, last_step: dict[int, int]) -> None:
        """Fire every cue that is due; lift every fault whose time is up."""
        kills = any(c.kind == "kill" and c.by_step for c in self.pending)
        if kills and not self.workers.pids and isinstance(event, RecordEvent):
            self.workers.find()  # ahead: the kill itself is then one exec
        for cue in list(self.pending):
            if due(cue, event, now, self.started):
                self.pending.remove(cue)
                self._fire(cue, last_step)
        for lift in list(self._lifts):
            when, undo, text = lift
            if now >= when:
                self._lifts.remove(lift)
                said = undo()
                self._log(text + (f" ({said})" if said else ""))

    def _fire(self, cue: FaultCue, last_step: dict[int, int]) -> None:
        if cue.kind == "kill":
            self._kill(cue, last_step)
        elif cue.kind == "link":
            assert cue.ms is not None
            self._quiet_until = time.time() + _LINK_SETTLE_S
            self._log(f"{cue.describe()}: shaping the new link and probing it")
            rate = cue.rate_mbit or self.plan.rate_mbit
            self._log(self._set_link(cue.ms, rate, judge=False))
        else:
            self._node_fault(cue)

    def _kill(self, cue: FaultCue, last_step: dict[int, int]) -> None:
        assert cue.rank is not None
        found = self.workers.pids if cue.rank in self.workers.pids else self.workers.find()
        if cue.rank not in found:
            self._log(f"{cue.describe()}: no worker with RANK={cue.rank} found, nothing killed")
            return
        node, pid = found[cue.rank]
        code, out = self.cluster.exec(node, ["kill", "-9", str(pid)])
        said = f"exit {code}" + (f": {out.strip()}" if out.strip() else "")
        reached = last_step.get(cue.rank)
        had = f"; it had reported step {reached}" if reached is not None else ""
        self._log(f"{cue.describe()}: SIGKILL of pid {pid} in node{node} ({said}{had})")
        if self.plan.instrument:
            # The survivors' flight recorders now, while they wait for the dead rank: torchrun's
            # agent soon SIGTERMs the dead rank's node-mates, which then leave no dump.
            time.sleep(_SNAPSHOT_AFTER_S)
            self.workers.request_dumps(f"{job_dir(JOB)}/logs")

    def _node_fault(self, cue: FaultCue) -> None:
        assert cue.node is not None
        fault = Pause() if cue.kind == "pause" else Partition()
        fault.prepare(self.cluster, cue.node)
        self._stack.enter_context(fault)  # released on the way out, whatever happens
        fault.inject()
        self._log(f"{cue.describe()}: {fault.detail}")
        if cue.for_s is None:
            return
        self._quiet_until = max(self._quiet_until, time.time() + cue.for_s + _LINK_SETTLE_S)
        lift = _unpause(fault) if isinstance(fault, Pause) else fault.release
        self._lifts.append((time.time() + cue.for_s, lift, f"{cue.kind} of node{cue.node} lifted"))


def _unpause(fault: Pause) -> Callable[[], str | None]:
    def undo() -> str | None:
        fault._paused = False  # lifted here: the release on the way out has nothing to do
        fault._container().unpause()
        return "docker unpause"

    return undo


# The run: the user's script under torchrun on every node, followed, faulted on cue, and
# explained when its steps stop.
#
# One cluster (granted SYS_PTRACE for py-spy, NET_ADMIN when the link is shaped or cut); the
# workdir goes into every node through the engine's API (``put_archive``: nothing shared but
# the network, so it works across engines); one torchrun per node meets at node 0's c10d
# rendezvous and runs the command with torchrun's environment, plus the instrumentation's
# (``DDP_INSTRUMENT``: every DDP the script builds reports typed records). The lab follows the
# step records, fires the faults whose cue came (the cues, above), and when no step came for
# the hang limit (.hang) or a node failed, it asks every live worker for its flight recorder
# (SIGUSR2) and its Python stack (py-spy), says the one line, stops the workers. The cluster's
# context manager collects every file and removes everything, on errors and Ctrl-C too.

_WAIT_SLACK_S = 15.0
_DUMP_GRACE_S = 3.0  # SIGUSR2 -> every live rank's dump on the volume
_STOP_S = 20.0  # workers killed -> torchrun's agents exit
_SITE_DIR = "/opt/lab-run-site"  # the instrumentation's sitecustomize in every node
_Echo = Callable[[str], None]


def instrument_env(log_dir: str) -> dict[str, str]:
    """What turns the image's instrumentation on for every Python process of the job: its
    records in ``log_dir`` (the job's directory on the volume) and on stdout, and its
    ``sitecustomize`` first on the path (copied to :data:`_SITE_DIR` in every node)."""
    return instrument_environment(log_dir, site=Path(_SITE_DIR))


def _copy_site(cluster: Cluster) -> None:
    """The instrumentation's ``sitecustomize.py`` into every node's :data:`_SITE_DIR`: the
    file activates ``ddp.instrument`` (in the image) when ``DDP_INSTRUMENT=1``."""
    data = (site_dir() / "sitecustomize.py").read_bytes()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        info = tarfile.TarInfo(f"{_SITE_DIR.strip('/')}/sitecustomize.py")
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


def copy_workdir(cluster: Cluster, plan: RunPlan, echo: _Echo) -> None:
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


def _sources(workdir: Path) -> dict[str, list[str]]:
    """The workdir's Python files, line by line, by their path in it: what a rank's stack is
    placed in, and the source line shown there."""
    sources = {}
    for path in workdir_files(workdir)[0]:
        if path.suffix == ".py":
            with contextlib.suppress(OSError, UnicodeDecodeError):
                rel = path.relative_to(workdir).as_posix()
                sources[rel] = path.read_text().splitlines()
    return sources


def _diagnose(
    cluster: Cluster, plan: RunPlan, job: Job, stacks: Workers, quiet_s: float | None
) -> str:
    """Ask every live worker for its flight recorder and its stack; the one line."""
    stacks.find()
    asked = time.time()
    if plan.instrument:
        stacks.request_dumps(f"{job_dir(JOB)}/logs")
    where = stacks.read(NODE_WORKDIR, _sources(plan.workdir))
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
    stacks = Workers(cluster)
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
            copy_workdir(cluster, plan, echo)
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


# The analysis: what the run found, from its result alone: the step times (per rank, and the
# job's: the slowest rank's per step), the bytes that crossed the link per step (every node's
# eth0 tx_bytes summed, as ``lab topology`` measures them), whether the replicas ended
# identical (the digests of every rank's final parameters), and the last line. Pure: tested on
# synthetic results.


def percentile(values: list[float], q: float) -> float:
    """Nearest-rank percentile (q in 0..100) of a non-empty list."""
    ordered = sorted(values)
    k = max(0, min(len(ordered) - 1, math.ceil(q / 100 * len(ordered)) - 1))
    return ordered[k]


def _samples(text: str) -> list[tuple[float, int]]:
    out = []
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 3:
            try:
                out.append((float(parts[0]), int(parts[1])))
            except ValueError:
                continue  # a line cut short when the sampler was stopped
    return out


def _tx_at(samples: list[tuple[float, int]], t: float) -> int | None:
    """The counter at the last sample at or before ``t``."""
    best = None
    for ts, tx in samples:
        if ts <= t:
            best = tx
        else:
            break
    return best


def link_bytes(counters: dict[int, str], ends: list[float]) -> list[float]:
    """Bytes every node sent on eth0 between consecutive step ends (``ends``, sorted)."""
    per_node = [_samples(text) for text in counters.values()]
    out = []
    for a, b in itertools.pairwise(ends):
        total = 0.0
        for samples in per_node:
            ta, tb = _tx_at(samples, a), _tx_at(samples, b)
            if ta is None or tb is None:
                break
            total += tb - ta
        else:
            out.append(total)
    return out


@dataclass
class RunSummary:
    """Built from the result alone; the files, the console text and the page come from it."""

    result: RunResult
    job_steps: dict[int, float] = field(default_factory=dict)  # step -> slowest rank's ms
    per_rank: dict[int, list[StepSeen]] = field(default_factory=dict)
    median_ms: float | None = None
    p90_ms: float | None = None
    step_bytes: dict[int, float] = field(default_factory=dict)  # step -> bytes on the link
    mb_per_step: float | None = None
    identical: bool | None = None  # None: not every rank left a digest

    @property
    def steps(self) -> int:
        return len(self.job_steps)

    @property
    def ok(self) -> bool:
        return self.result.diagnosis is None and self.result.clean

    @property
    def broken(self) -> str:
        if self.result.diagnosis is not None:
            return f"diagnosis: {self.result.diagnosis}"
        if not self.result.clean:
            codes = ", ".join(f"node{n} {c}" for n, c in sorted(self.result.exits.items()))
            return f"the job did not end cleanly: torchrun's exit codes {codes or 'none'}"
        return ""

    def replicas(self) -> str:
        if self.identical is None:
            n = len(self.result.digests)
            world = self.result.plan.layout.world_size
            return f"no parameter digest from {world - n} of {world} ranks"
        return "replicas identical at the end" if self.identical else "replicas DIFFER at the end"

    def headline(self) -> str:
        """``run: 4 ranks on 2 nodes, 5 ms between nodes; 120 steps, median 84.2 ms (p90
        91.0); 2.7 MB/step on the link; replicas identical at the end``."""
        plan = self.result.plan
        world = plan.layout.world_size
        parts = [f"run: {world} ranks on {plan.nodes} nodes, {plan.link_text()}"]
        if self.median_ms is not None and self.p90_ms is not None:
            parts.append(
                f"{self.steps} steps, median {self.median_ms:.1f} ms (p90 {self.p90_ms:.1f})"
            )
        else:
            parts.append("no step records" if plan.instrument else "not instrumented")
        if self.mb_per_step is not None:
            parts.append(f"{self.mb_per_step:.1f} MB/step on the link")
        if self.result.diagnosis is None:
            parts.append(self.replicas() if plan.instrument else self._exits())
        else:
            parts.append(self._exits())
        return "; ".join(parts)

    def _exits(self) -> str:
        codes = self.result.exits
        if codes and all(c == 0 for c in codes.values()) and not self.result.running:
            return "every node's torchrun exited 0"
        return "torchrun's exits: " + (
            ", ".join(f"node{n} {c}" for n, c in sorted(codes.items())) or "none"
        )

    def lines(self) -> list[str]:
        """The console's closing lines: the headline, then the diagnosis last, if any."""
        out = [self.headline()]
        if self.result.diagnosis is not None:
            out.append(f"diagnosis: {self.result.diagnosis}")
        return out


def analyse(result: RunResult) -> RunSummary:
    s = RunSummary(result)
    for seen in result.steps:
        s.per_rank.setdefault(seen.rank, []).append(seen)
        s.job_steps[seen.step] = max(seen.step_ms, s.job_steps.get(seen.step, seen.step_ms))
    timed = [ms for step, ms in sorted(s.job_steps.items()) if step > 1] or list(
        s.job_steps.values()
    )  # the first step holds gloo's connection set-up
    if timed:
        s.median_ms, s.p90_ms = statistics.median(timed), percentile(timed, 90)
    lead = sorted(s.per_rank.get(0, []), key=lambda x: x.step)
    every = len(result.counters) == result.plan.nodes  # a node not read: no total to give
    if every and len(lead) >= 2:
        per = link_bytes(result.counters, [x.t for x in lead])
        s.step_bytes = {x.step: b for x, b in zip(lead[1:], per, strict=False)}
        if s.step_bytes:
            s.mb_per_step = statistics.median(s.step_bytes.values()) / 1e6
    world = result.plan.layout.world_size
    if len(result.digests) >= world:
        s.identical = len(set(result.digests.values())) == 1
    return s


# The files: ``report.json`` (the plan, every step, the faults, the exits, the diagnosis),
# ``steps.png`` (step time per rank over time, the faults marked; bytes on the link per step
# below) and the TensorBoard scalars ``tb/run/``, each from the run's summary.

FIGURE = "steps.png"


def _plot(summary: RunSummary, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    result = summary.result
    t0 = result.started
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6), dpi=110, sharex=True)
    for rank, steps in sorted(summary.per_rank.items()):
        steps = sorted(steps, key=lambda s: s.step)
        top.plot([s.t - t0 for s in steps], [s.step_ms for s in steps], ".-", ms=3, lw=0.8,
                 label=f"rank {rank}")  # fmt: skip
    for f in result.faults:
        for ax in (top, bottom):
            ax.axvline(f.at_s, color="red", ls="--", lw=0.8)
        top.annotate(f.text[:40], (f.at_s, 0), rotation=90, fontsize=7, color="red",
                     xytext=(2, 2), textcoords="offset points", va="bottom")  # fmt: skip
    top.set_ylabel("step time (ms)")
    top.set_title(summary.headline()[:110], fontsize=9)
    if summary.per_rank:
        top.legend(fontsize=7, ncol=4)
    lead = {s.step: s.t - t0 for s in summary.per_rank.get(0, [])}
    xs = [lead[k] for k in sorted(summary.step_bytes) if k in lead]
    ys = [summary.step_bytes[k] / 1e6 for k in sorted(summary.step_bytes) if k in lead]
    bottom.plot(xs, ys, ".-", color="C7", ms=3, lw=0.8)
    bottom.set_ylabel("MB on the link per step\n(eth0 tx, all nodes)")
    bottom.set_xlabel("seconds from the job's start")
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def write_scalars(summary: RunSummary, folder: Path) -> Path | None:
    """Step time per rank and bytes per step as TensorBoard scalars; None without tensorboard
    or without a step."""
    if not tensorboard_available() or not summary.per_rank:
        return None
    from torch.utils.tensorboard import SummaryWriter

    writer = SummaryWriter(log_dir=str(folder))
    try:
        for rank, steps in summary.per_rank.items():
            for s in steps:
                writer.add_scalar(f"step_ms/rank{rank}", s.step_ms, global_step=s.step)
        for step, nbytes in summary.step_bytes.items():
            writer.add_scalar("link_mb_per_step", nbytes / 1e6, global_step=step)
    finally:
        writer.close()
    return folder


def write_files(summary: RunSummary) -> list[Path]:
    result, plan = summary.result, summary.result.plan
    run_dir = Path(result.run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    data = {
        "run_id": result.run_id,
        "ok": summary.ok,
        "seconds": round(result.seconds, 3),
        "headline": summary.headline(),
        "diagnosis": result.diagnosis,
        "plan": {
            "command": list(plan.command),
            "workdir": str(plan.workdir),
            "nodes": plan.nodes,
            "ranks_per_node": plan.ranks_per_node,
            "link": plan.link_text(),
            "faults": [c.text for c in plan.faults],
            "hang_after_s": plan.hang_after_s,
            "instrument": plan.instrument,
            "image": result.image,
        },
        "links": result.links,
        "faults": [asdict(f) for f in result.faults],
        "exit_codes": {str(n): c for n, c in sorted(result.exits.items())},
        "running": result.running,
        "median_step_ms": summary.median_ms,
        "p90_step_ms": summary.p90_ms,
        "mb_per_step": summary.mb_per_step,
        "replicas_identical": summary.identical,
        "digests": {str(r): d for r, d in sorted(result.digests.items())},
        "steps": [asdict(s) for s in result.steps],
        "link_bytes_per_step": {str(k): v for k, v in sorted(summary.step_bytes.items())},
    }
    path = run_dir / "report.json"
    path.write_text(json.dumps(data, indent=2))
    written = [path]
    if summary.per_rank:
        _plot(summary, run_dir / FIGURE)
        written.append(run_dir / FIGURE)
    return written


# The page: the headline, the step times and the link's bytes over time (the faults marked),
# the fault timeline, each node's exit and the diagnosis. From the run's summary.

_FILES = [("report.json", "the plan, every step record, the faults, the exits, the diagnosis")]


def page(summary: RunSummary) -> Results:
    result = summary.result
    command = command_line("run")
    verdict = summary.broken or summary.replicas()
    figure = summary.headline()
    caption = "step time per rank; MB on the link per step"
    sections = [figures_section(result.run_dir, [(FIGURE, caption)])]
    if result.diagnosis is not None:
        sections.append(Section("Diagnosis", [Text([result.diagnosis], pre=True)]))
    timeline = [f"{f.at_s:+8.2f} s  {f.text}" for f in result.faults] or ["no fault"]
    sections.append(Section("Faults (seconds from the job's start)", [Text(timeline, pre=True)]))
    if result.links:
        sections.append(Section("The link, verified by the probe", [Text(result.links, pre=True)]))
    last = {r: max(s.step for s in steps) for r, steps in summary.per_rank.items()}
    rows = [
        [r, last.get(r, "-"), result.digests.get(r, "-")[:16]]
        for r in range(result.plan.layout.world_size)
    ]
    exits = [[f"node{n}", c] for n, c in sorted(result.exits.items())]
    exits += [[f"node{n}", "still running, stopped"] for n in result.running]
    sections.append(
        Section(
            "How each rank and node ended",
            [
                Table(("rank", "last step", "parameter digest"), rows),
                Table(("node", "torchrun's exit code"), exits),
            ],
        )
    )
    ok = summary.ok and summary.identical is not False
    html = Page(f"lab run: run {result.run_id}", Headline(command, verdict, figure, ok), sections)
    configs = {"run": summary.median_ms} if summary.median_ms is not None else {}
    made = Summary(
        "run", result.run_id, command, started_at(result.seconds), result.seconds, figure,
        verdict, ok, configs,
    )  # fmt: skip
    return Results(html, made, list(_FILES), [JOB])


# The report: the files, the scalars and the page from one summary, then what is printed.


def report(result: RunResult) -> int:
    """Exit 0 when the job ended cleanly and no rank's replica differs."""
    summary = analyse(result)
    written = write_files(summary)
    write_scalars(summary, Path(result.run_dir) / TB_DIR / "run")
    made = page(summary)
    names = ", ".join(p.name for p in written)
    print(f"took {result.seconds:.0f} s; wrote {result.run_dir}/: {names}")
    for line in publish(result.run_dir, made.page, made.summary, made.files, made.jobs):
        print(line)
    for line in summary.lines():
        print(line)
    return 0 if summary.ok and summary.identical is not False else 1
