"""``python -m lab kill``: hit one rank of a four-node run, report who noticed what, recover.

The containers' main process is a bounded ``sleep``; every phase (see :mod:`lab.fault_plan`)
execs the node launcher into each container, so a container that was killed can be started
again and resume on the same volume. Lab follows every container's log, and when rank ``R``
reports step ``S-1`` done it injects the fault into R's container: ``docker kill`` (SIGKILL),
``docker pause`` (SIGSTOP-like freeze) or iptables DROP rules inside it (a partition). Then it
waits, bounded by the collective timeout plus slack, for the survivors to exit with ddp's
diagnosis, collects logs and flight dumps into ``runs/<run-id>/`` and builds the report with
:mod:`lab.fault_report`. Everything labelled with the run id is removed on the way out,
also on errors and Ctrl-C.
"""

from __future__ import annotations

import contextlib
import json
import time
from dataclasses import asdict
from pathlib import Path

import docker.errors
import requests.exceptions

from lab.cluster import Cluster, NodeHandle
from lab.engine import LabError, NodeFailed, RunTimeout, connect, require_image
from lab.fault_phase import Echo, Phase
from lab.fault_plan import (
    FaultPlan,
    partition_commands,
    phase_dir,
    shell_script,
)
from lab.fault_recovery import Recovery, compare_runs, read_run_records
from lab.fault_report import (
    FaultReport,
    Injection,
    build_report,
    is_setup_line,
    progress_step,
)
from lab.specs import DEFAULT_IMAGE, resource_name
from lab.topology import Topology, TrainSettings

__all__ = ["run_kill"]

_GONE = (docker.errors.APIError, requests.exceptions.RequestException)


def _ip(cluster: Cluster, node: NodeHandle) -> str:
    node.container.reload()
    return node.container.attrs["NetworkSettings"]["Networks"][resource_name(cluster.run_id)][
        "IPAddress"
    ]


def _run_undisturbed(
    cluster: Cluster, plan: FaultPlan, name: str, echo: Echo, phases: dict[str, Phase]
) -> Phase:
    """Run a phase to its end; every rank must exit 0 (parity holds)."""
    echo(
        f"== {name}: {plan.steps} steps"
        + (", from the newest checkpoint" if name == "resume" else "")
        + f" (logs in {phase_dir(name)}/logs)"
    )
    phase = phases[name] = Phase(cluster, plan, name, echo)
    ranks = list(range(plan.world_size))
    running = phase.wait_exits(ranks, plan.run_deadline_s())
    if running:
        tails = "\n".join(f"  rank {r}:\n{phase.last_lines(r)}" for r in running)
        raise RunTimeout(
            f"{name} run did not finish within {plan.run_deadline_s():.0f} s; ranks still "
            f"running: {running}. Last lines:\n{tails}"
        )
    failed = {r: c for r, c in phase.exits.items() if c != 0}
    if failed:
        rank = min(failed)
        raise NodeFailed(
            f"{name} run failed: exit codes {dict(sorted(phase.exits.items()))}; rank {rank}'s "
            f"last lines:\n{phase.last_lines(rank, 12)}"
        )
    phase.close()
    return phase


class _Injector:
    """Puts the fault in place, and takes whatever it left behind away again."""

    def __init__(self, cluster: Cluster, plan: FaultPlan) -> None:
        self.cluster, self.plan = cluster, plan
        self.node = cluster.nodes[plan.rank]  # one rank per node
        self.detail = ""
        self._undo: list[list[str]] | None = None
        self._cut: list[list[str]] = []
        self.paused = False

    def prepare(self) -> None:
        """Before training: everything that can be done ahead, so the injection is quick."""
        if self.plan.mode != "partition":
            return
        peers = [_ip(self.cluster, n) for n in self.cluster.nodes if n is not self.node]
        prepare, self._cut, undo = partition_commands(peers)
        self._exec(prepare, "prepare the partition rules")
        self._undo = undo
        self.detail = f"iptables DROP to/from {', '.join(peers)}"

    def inject(self, trigger_time: float) -> Injection:
        start = time.time()
        if self.plan.mode == "kill":
            self.node.container.kill()
        elif self.plan.mode == "pause":
            self.node.container.pause()
            self.paused = True
        else:
            self._exec(self._cut, "cut the node off")
        return Injection(
            self.plan.mode,
            self.plan.rank,
            self.node.index,
            trigger_time,
            start,
            time.time(),
            self.detail,
        )

    def release(self) -> str | None:
        """Undo the fault's leftovers (a paused rank is SIGKILLed, never resumed: it would run
        on against peers that are gone and overwrite its flight dump). Returns what it did."""
        if self.paused:
            self.paused = False
            with contextlib.suppress(*_GONE):
                self.node.container.kill()
                return (
                    "the paused container was SIGKILLed (as docker kill) after the survivors exited"
                )
        if self._undo is not None:
            undo, self._undo = self._undo, None
            with contextlib.suppress(*_GONE):
                code, _ = self.node.container.exec_run(shell_script(undo, keep_going=True))
                return f"partition rules removed (exit {code})"
        return None

    def _exec(self, commands: list[list[str]], what: str) -> None:
        result = self.node.container.exec_run(shell_script(commands))
        if result.exit_code != 0:
            raise LabError(
                f"could not {what} in node{self.node.index} (exit {result.exit_code}): "
                f"{result.output.decode(errors='replace').strip()}; the container needs "
                "NET_ADMIN and iptables (rebuild the image with `python -m lab image`)"
            )


def _run_fault(
    cluster: Cluster, plan: FaultPlan, injector: _Injector, echo: Echo, phases: dict[str, Phase]
) -> tuple[Phase, Injection | None, list[str]]:
    injector.prepare()
    prev = plan.at_step - 1
    echo(
        f"== fault: {plan.mode} rank {plan.rank} (node{plan.rank}) as soon as it reports step "
        f"{prev} done, so the fault lands in step {plan.at_step}"
    )
    phase = phases["fault"] = Phase(cluster, plan, "fault", echo)
    reach_s = plan.run_deadline_s(prev)
    deadline = time.monotonic() + reach_s
    injection = None
    while injection is None:
        if time.monotonic() > deadline:
            raise RunTimeout(
                f"rank {plan.rank} did not report step {prev} within {reach_s:.0f} s; its last "
                f"lines:\n{phase.last_lines(plan.rank)}"
            )
        if phase.exits:
            rank = min(phase.exits)
            raise NodeFailed(
                f"rank {rank} exited with code {phase.exits[rank]} before the fault was "
                f"injected; its last lines:\n{phase.last_lines(rank, 12)}"
            )
        got = phase.poll()
        if got is None or got[1] != plan.rank:
            continue
        t, _, text = got
        if (progress_step(plan.rank, text) == prev) if prev else is_setup_line(text):
            injection = injector.inject(t)
            echo(
                f"[lab] t={injection.end - phase.start:+.2f} s: {plan.mode} rank {plan.rank} "
                f"(docker call {injection.end - injection.start:.3f} s)"
            )
    notes = []
    running = phase.wait_exits(plan.survivors, plan.notice_deadline_s())
    if running:
        notes.append(
            f"ranks {running} were still running {plan.notice_deadline_s():.0f} s after the "
            "fault (collective timeout + dump grace + slack)"
        )
    released = injector.release()
    if released:
        notes.append(released)
        if plan.mode == "pause":
            phase.wait_exits([plan.rank], 30)  # the stream of the killed container ends
    phase.close()
    return phase, injection, notes


def _reset(cluster: Cluster) -> None:
    """A fresh main process in every container (a killed one starts again): no rank of the
    fault phase survives into the next phase; the volume, network and containers stay."""
    for node in cluster.nodes:
        node.container.reload()
        if node.container.status in ("running", "paused"):
            node.container.kill()
        node.container.wait(timeout=30)
        node.container.start()


def run_kill(
    plan: FaultPlan,
    image: str = DEFAULT_IMAGE,
    runs_dir: Path = Path("runs"),
    echo: Echo = print,
) -> int:
    """Run the plan; print the report; 0 iff the diagnosis names the rank that was hit (and,
    with ``plan.recover``, the resumed run ends bitwise identical to an uninterrupted one)."""
    client = connect(timeout_s=120)
    require_image(client, image)
    topology = Topology(
        nodes=plan.nodes,
        train=TrainSettings(
            steps=plan.steps,
            batch_size=plan.batch_size,
            model=plan.model,
            seed=plan.seed,
            collective_timeout_s=plan.timeout_s,
        ),
    )
    cluster = Cluster(client, topology, image, net_admin=plan.mode == "partition")
    run_dir = runs_dir / cluster.run_id
    echo(
        f"run {cluster.run_id}: {plan.nodes} nodes x 1 rank, model {plan.model}, {plan.steps} "
        f"steps ({plan.step_delay_ms:g} ms step delay), collective timeout {plan.timeout_s:g} s, "
        f"checkpoint every {plan.checkpoint_every or 'never'}; fault: {plan.mode} rank "
        f"{plan.rank} in step {plan.at_step}{', then recover' if plan.recover else ''}; "
        f"output in {run_dir}/"
    )
    injector: _Injector | None = None
    phases: dict[str, Phase] = {}
    summary: dict = {"run_id": cluster.run_id, "plan": asdict(plan), "image": image}
    report: FaultReport | None = None
    recovery: Recovery | None = None
    started = time.monotonic()
    try:
        cluster.start(command=["sleep", str(plan.lifetime_s())])
        injector = _Injector(cluster, plan)
        if plan.recover:
            _run_undisturbed(cluster, plan, "reference", echo, phases)
        phase, injection, notes = _run_fault(cluster, plan, injector, echo, phases)
        cluster.collect(run_dir, paths=(phase_dir("fault"),))
        from ddp.flight_recorder import load_dumps

        dumps = load_dumps(run_dir / "fault" / "logs" / "flight")
        report = build_report(plan, phase.start, injection, phase.lines, phase.exits, dumps)
        report.notes += notes
        echo(report.text())
        if plan.recover:
            echo(report.last_line)  # the diagnosis, before the recovery begins
            _reset(cluster)
            _run_undisturbed(cluster, plan, "resume", echo, phases)
    finally:
        if injector is not None:
            injector.release()
        if cluster.nodes:
            try:
                cluster.collect(run_dir, paths=tuple(phase_dir(p) for p in phases))
                for name, ph in phases.items():
                    ph.write_output(run_dir / name / "output.log")
            except Exception as e:  # best effort: the error being raised matters more
                echo(f"warning: could not collect {run_dir}/: {e}")
        removed = cluster.remove()
        echo(f"removed {removed} containers/networks/volumes labelled lab.run={cluster.run_id}")

    if plan.recover:
        recovery = compare_runs(
            read_run_records(run_dir / "reference" / "logs"),
            read_run_records(run_dir / "resume" / "logs"),
            plan.world_size,
        )
        echo(
            f"recovery: resumed from the checkpoint of step {recovery.resumed_from} (fault in "
            f"step {plan.at_step}); sha256 of the final parameters, resumed vs uninterrupted: "
            + "; ".join(recovery.details)
        )
    assert report is not None
    summary |= {
        "seconds": round(time.monotonic() - started, 3),
        "phases": {
            name: {
                "exit_codes": {str(r): c for r, c in sorted(ph.exits.items())},
                "started": ph.start,
            }
            for name, ph in phases.items()
        },
        "fault": report.to_dict(),
        "recovery": asdict(recovery) if recovery else None,
    }
    ok = report.ok and (recovery is None or recovery.ok)
    summary["ok"] = ok
    (run_dir / "report.json").write_text(json.dumps(summary, indent=2, default=str))
    echo(report.last_line)
    if recovery is not None:
        echo(recovery.last_line)
    return 0 if ok else 1
