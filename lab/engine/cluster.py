"""A run's containers, network and volume, as a context manager that always cleans up.

``with Cluster(client, layout, run_dir=...) as cluster:`` creates the network, the volume and
one idle container per node, on one engine or placed on several (:mod:`lab.engine.placement`);
if that fails half-way, what exists is removed before the error propagates. Jobs are exec'd
into the nodes with :meth:`Cluster.job` or :meth:`Cluster.train`; on the way out, also on
errors and Ctrl-C, every job's output and its directory on the volume (each engine's) are
copied into ``run_dir/<job>/`` and everything labelled with the run id is removed.
"""

from __future__ import annotations

import io
import tarfile
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any

import docker.errors
from docker.models.containers import Container

import docker
from ddp.torchfree import TrainConfig
from lab.engine.client import LabError, require_image
from lab.engine.events import Event
from lab.engine.hosts import HostSet
from lab.engine.job import Job, JobOptions
from lab.engine.layout import Layout
from lab.engine.placement import Engines, current, down
from lab.engine.reach import check_reach
from lab.engine.specs import (
    DEFAULT_IMAGE,
    LABEL,
    container_spec,
    job_dir,
    new_run_id,
    resource_name,
)
from lab.engine.training import TORCHRUN_ENV, Torchrun, train_argvs

if TYPE_CHECKING:
    from typing_extensions import Unpack

__all__ = ["TCP_RDZV_PORT", "Cluster", "NodeHandle", "down"]

TCP_RDZV_PORT = 29500  # across engines, job k of a cluster meets at rank 0's port 29500 + k


@dataclass
class NodeHandle:
    """One node's container, the global ranks it runs, and the host it runs on."""

    index: int
    ranks: list[int]
    container: Container
    host: str = "host0"

    @property
    def name(self) -> str:
        return f"node{self.index}"


# Run ids of the clusters this process started, oldest first: what the CLI names after Ctrl-C
# (``lab down --run ID``), so that a shared engine's other runs are not swept away too.
STARTED: list[str] = []


class Cluster:
    """The containers, network and volume of one run, all labelled ``lab.run=<run_id>``."""

    def __init__(
        self,
        client: docker.DockerClient,
        layout: Layout,
        *,
        image: str = DEFAULT_IMAGE,
        run_id: str | None = None,
        run_dir: Path | None = None,
        lifetime_s: float = 3600.0,
        net_admin: bool = False,
        cpus: Mapping[int, float] | None = None,
        echo: Callable[[str], None] = print,
        hosts: HostSet | None = None,
        ptrace: bool = False,
    ) -> None:
        self.client, self.layout, self.image = client, layout, image
        # The hosts of the run (--hosts, default the local engine alone): see lab.engine.placement.
        self.engines = Engines(client, hosts or current(), layout.nodes, echo)
        self.run_id = run_id or new_run_id()
        self.run_dir = run_dir
        self.lifetime_s, self.net_admin, self.cpus = lifetime_s, net_admin, dict(cpus or {})
        self.ptrace = ptrace
        self.echo = echo
        self.nodes: list[NodeHandle] = []
        self.jobs: list[Job] = []

    def __enter__(self) -> Cluster:
        require_image(self.engines.client(0), self.image)
        STARTED.append(self.run_id)
        try:
            self.engines.create(self.run_id, self.image)
            for i in range(self.layout.nodes):
                spec = container_spec(
                    self.run_id,
                    i,
                    self.image,
                    lifetime_s=self.lifetime_s,
                    net_admin=self.net_admin,
                    cpus=self.cpus.get(i),
                    ptrace=self.ptrace,
                )
                container = self.engines.client(i).containers.create(**spec)
                host = self.engines.host(i).name
                self.nodes.append(NodeHandle(i, self.layout.ranks_of(i), container, host))
            for node in self.nodes:
                node.container.start()
            if self.engines.several:
                # Seconds here, where a broken overlay would otherwise cost the rendezvous
                # timeout and a diagnosis that blames a rank.
                t0 = time.monotonic()
                check_reach(self)
                pairs = len(self.nodes) * (len(self.nodes) - 1)
                self.echo(
                    f"every node reaches every other across engines ({pairs} pairs checked "
                    f"in {time.monotonic() - t0:.1f} s)"
                )
        except BaseException:
            self.remove()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            if self.run_dir is not None and self.nodes:
                try:
                    self.collect(self.run_dir)
                except Exception as e:  # best effort: the error being raised matters more
                    self.echo(f"warning: could not collect {self.run_dir}/: {e}")
        finally:
            removed = self.remove()
            self.echo(
                f"removed {removed} containers/networks/volumes labelled {LABEL}={self.run_id}"
            )

    # --- jobs ---------------------------------------------------------------------------
    def job(
        self,
        name: str,
        argvs: dict[int, list[str]],
        timeout_s: float,
        **options: Unpack[JobOptions],
    ) -> Job:
        """Start ``argvs`` (rank -> argv; node -> argv with ``per_node``) as job ``name``; its
        directory is made first."""
        if any(j.name == name for j in self.jobs):
            raise ValueError(f"job {name!r} already ran in this cluster; pick another name")
        for node in self.engines.first_nodes():  # every engine has a volume of its own
            self.check(node, ["mkdir", "-p", f"{job_dir(name)}/logs"], f"create {job_dir(name)}")
        job = Job(self, name, argvs, timeout_s, **options)
        self.jobs.append(job)
        return job.start()

    def train(
        self,
        name: str,
        cfg: TrainConfig,
        timeout_s: float,
        *,
        overrides: Mapping[int, Mapping[str, Any]] | None = None,
        echo: Callable[[Event], None] | None = None,
    ) -> Job:
        """A training job: ``python -m ddp train`` on every rank (:mod:`lab.engine.training`),
        meeting at a file on the shared volume, or across engines at rank 0's TCP store."""
        init = None
        if self.engines.several:  # one port per job: a finished job's store may linger
            init = f"tcp://{self.address(0)}:{TCP_RDZV_PORT + len(self.jobs)}"
        argvs = train_argvs(name, self.layout, cfg, overrides, init=init)
        return self.job(name, argvs, timeout_s, echo=echo)

    def torchrun(
        self,
        name: str,
        cfg: TrainConfig,
        timeout_s: float,
        *,
        launch: Torchrun | None = None,
        echo: Callable[[Event], None] | None = None,
    ) -> Job:
        """A training job under torchrun: one agent per node, its c10d rendezvous on node 0,
        ranks assigned by it (follow them by ``record.rank``; exits are per node)."""
        launch = launch or Torchrun(self.layout.nodes, self.layout.ranks_per_node)
        if launch.nodes != len(self.nodes):
            raise ValueError(
                f"torchrun for {launch.nodes} nodes on a {len(self.nodes)}-node cluster"
            )
        cfg.local_batch(launch.nodes * launch.procs_per_node)
        host = self.address(0)
        argvs = {n.index: launch.argv(name, cfg, host, self.address(n.index)) for n in self.nodes}
        return self.job(name, argvs, timeout_s, env=TORCHRUN_ENV, echo=echo, per_node=True)

    # --- nodes --------------------------------------------------------------------------
    def exec(
        self, node: int, argv: list[str], env: dict[str, str] | None = None
    ) -> tuple[int, str]:
        """Run ``argv`` in a node (as root, ``env`` added to its environment), returning exit
        code and combined output."""
        result = self.nodes[node].container.exec_run(argv, environment=env)
        return result.exit_code, result.output.decode(errors="replace")

    def check(self, node: int, argv: list[str], what: str) -> str:
        code, out = self.exec(node, argv)
        if code != 0:
            raise LabError(f"could not {what} in node{node} (exit {code}): {out.strip()}")
        return out

    def set_cpus(self, node: int, cpus: float | None, period_us: int = 100_000) -> None:
        """Change a running node's CPU quota (CFS bandwidth: ``cpus`` cores per ``period_us``;
        None lifts it), so one set of containers runs an unslowed job and then a straggler.
        Needs a node created without ``cpus=`` (docker refuses a quota beside NanoCPUs)."""
        quota = -1 if cpus is None else max(1000, int(cpus * period_us))
        self.nodes[node].container.update(cpu_period=period_us, cpu_quota=quota)

    def address(self, node: int) -> str:
        """The node's IP address on the run's network."""
        container = self.nodes[node].container
        container.reload()
        return container.attrs["NetworkSettings"]["Networks"][resource_name(self.run_id)][
            "IPAddress"
        ]

    def restart(self, node: int) -> None:
        """A fresh main process in ``node`` (e.g. after it was killed or paused); the volume and
        network stay, and nothing of an earlier job survives in it."""
        container = self.nodes[node].container
        container.reload()
        if container.status == "paused":
            container.unpause()
        if container.status in ("running", "paused"):
            container.kill()
        container.wait(timeout=30)
        container.start()

    # --- results ------------------------------------------------------------------------
    def collect(self, dest: Path) -> Path:
        """Copy every job's output (``<job>/node<N>.log``) and its directory on the volume
        (``<job>/logs/...``) into ``dest``."""
        dest.mkdir(parents=True, exist_ok=True)
        for job in self.jobs:
            out = dest / job.name
            out.mkdir(parents=True, exist_ok=True)
            for node in self.nodes:
                (out / f"{node.name}.log").write_text(job.output(node.index))
            # Any node sees its engine's volume, and get_archive works on exited containers;
            # across engines each holds its own ranks' files, merged here.
            for node in self.engines.first_nodes():
                try:
                    chunks, _ = self.nodes[node].container.get_archive(job_dir(job.name))
                    _extract(b"".join(chunks), out)
                except docker.errors.NotFound:
                    continue  # the job never wrote there
        return dest

    def remove(self) -> int:
        """Remove everything of this run (by label, so half-created runs go too)."""
        for job in self.jobs:
            job.close()
        removed = self.engines.remove(self.run_id)
        self.nodes = []
        return removed


def _extract(tar_bytes: bytes, dest: Path) -> None:
    """Unpack a ``get_archive`` tar of one directory into ``dest``, keeping its layout.

    Regular files only, and only paths that stay inside ``dest`` (no absolute paths, no
    '..', no links): the archive comes from a container, which should not write on the host.
    """
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=io.BytesIO(tar_bytes)) as tar:
        for member in tar.getmembers():
            name = PurePosixPath(member.name)
            parts = name.parts[1:]  # drop the archived directory's own name
            if not member.isfile() or name.is_absolute() or not parts or ".." in parts:
                continue
            target = dest.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            data = tar.extractfile(member)
            assert data is not None
            target.write_bytes(data.read())
