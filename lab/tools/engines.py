"""``python -m lab engines up N | down | env K``: extra Docker engines on this one machine.

Every experiment runs across several engines with ``--hosts`` (see docs/multi-node.md). Where a
user has one machine, this gives them N more engines to try it with: each in its own network
namespace with its own address, images and volumes, as N other machines would be. They share
this machine's cores, so a run across them tests correctness, not speed.

Engine k (1..N) lives in network namespace ``lab-host<k>``, joined to this machine by a veth
pair: this side ``10.77.<k>.1``, the engine's side ``10.77.<k>.2``. Its dockerd listens on
``unix:///var/run/docker-host<k>.sock`` and keeps its state under ``/var/lib/docker-host<k>``.
This machine's own engine is ``host0``; the others reach it at ``10.77.1.1``, which is why
every veth route on this side takes that source address: a VXLAN peer drops packets whose
source is not the address the swarm advertised for their sender.

Needs root, ``ip``, ``iptables``, ``nsenter`` and ``dockerd`` (Debian: ``apt-get install
docker.io iproute2 iptables util-linux``), and this machine's engine running.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

NAME = "engines"
HELP = "start or remove extra Docker engines on this machine (to try --hosts on one machine)"
DESCRIPTION = (
    "Start N extra Docker engines on this machine, each in its own network namespace with its "
    "own address, images and volumes, and print a --hosts file for them; or remove them."
)
EPILOG = """\
examples:
  python -m lab engines up 2 --hosts-file hosts.txt   # host1, host2; hosts.txt names all three
  python -m lab image --hosts hosts.txt               # the image on every engine
  python -m lab up --nodes 3 --hosts hosts.txt
  python -m lab engines down

Needs root, ip, iptables, nsenter and dockerd (Debian: apt-get install docker.io iproute2
iptables util-linux). Exit codes: 0 done, 1 a step failed (its command and output are
printed), 2 bad arguments or a missing tool."""

_NS = "lab-host"  # network namespace lab-host<k>
_HOST0 = "10.77.1.1"  # this machine's address as every extra engine sees it
_TOOLS = ("ip", "iptables", "nsenter", "dockerd")
_START_S = 60.0  # a dockerd that does not answer by then has failed (its log says why)


def _sock(k: int) -> str:
    return f"/var/run/docker-host{k}.sock"


@dataclass(frozen=True)
class EnginesPlan:
    action: str  # up | down | env
    count: int = 0  # up: how many engines; env: which one
    hosts_file: Path | None = None

    def __post_init__(self) -> None:
        if self.action not in ("up", "down", "env"):
            raise ValueError(f"unknown action {self.action!r}: use up N, down or env K")
        if self.action == "up" and not 1 <= self.count <= 8:
            raise ValueError(f"up takes 1 to 8 engines, got {self.count}")
        if self.action == "env" and self.count < 1:
            raise ValueError(f"env takes an engine number from 1, got {self.count}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("action", choices=("up", "down", "env"))
    p.add_argument("count", nargs="?", type=int, default=0, help="up: how many; env: which")
    p.add_argument(
        "--hosts-file",
        type=Path,
        metavar="FILE",
        help="up: also write a --hosts file naming this machine's engine and the new ones",
    )


def plan(args: argparse.Namespace) -> EnginesPlan:
    result = EnginesPlan(args.action, args.count, args.hosts_file)
    if result.action == "env":
        return result
    if os.geteuid() != 0:
        raise ValueError("network namespaces and engines need root: run it as root")
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if missing:
        raise ValueError(
            f"{', '.join(missing)} not found: install them (Debian: apt-get install docker.io "
            "iproute2 iptables util-linux)"
        )
    return result


def _sh(*argv: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    if check and r.returncode != 0:
        from lab.engine.client import LabError

        raise LabError(f"{' '.join(argv)} failed (exit {r.returncode}): {r.stderr.strip()}")
    return r


def _answers(k: int) -> bool:
    sock = Path(_sock(k))
    return (
        sock.exists() and _sh("docker", "-H", f"unix://{sock}", "info", check=False).returncode == 0
    )


def _namespaces() -> list[int]:
    out = _sh("ip", "netns", "list").stdout.split()
    return sorted(int(w[len(_NS) :]) for w in out if w.startswith(_NS) and w[len(_NS) :].isdigit())


def _link(k: int) -> None:
    """The namespace, its veth pair and addresses, and the routes both ways."""
    ns, here, there = f"{_NS}{k}", f"vh{k}", f"vh{k}n"
    if k not in _namespaces():
        _sh("ip", "netns", "add", ns)
        _sh("ip", "link", "add", here, "type", "veth", "peer", "name", there)
        _sh("ip", "link", "set", there, "netns", ns)
        _sh("ip", "addr", "add", f"10.77.{k}.1/24", "dev", here)
        _sh("ip", "link", "set", here, "up")
        inside = ("ip", "netns", "exec", ns)
        _sh(*inside, "ip", "addr", "add", f"10.77.{k}.2/24", "dev", there)
        _sh(*inside, "ip", "link", "set", there, "up")
        _sh(*inside, "ip", "link", "set", "lo", "up")
        _sh(*inside, "ip", "route", "add", "default", "via", f"10.77.{k}.1")
        Path("/proc/sys/net/ipv4/ip_forward").write_text("1\n")
    if k >= 2:  # one source address towards every engine: the one host0 advertises
        route = ("ip", "route", "replace", f"10.77.{k}.0/24", "dev", here, "proto", "kernel")
        _sh(*route, "scope", "link", "src", _HOST0)
    # dockerd sets the FORWARD policy to DROP: let the engines reach each other through here.
    rule = ("FORWARD", "-i", "vh+", "-o", "vh+", "-j", "ACCEPT")
    if _sh("iptables", "-C", *rule, check=False).returncode != 0:
        _sh("iptables", "-I", *rule)


def _start_engine(k: int) -> None:
    if _answers(k):
        return
    for d in (f"/var/lib/docker-host{k}", f"/var/run/docker-host{k}"):
        Path(d).mkdir(parents=True, exist_ok=True)
    # nsenter --net, not `ip netns exec`, which remounts /sys and hides the cgroups dockerd needs
    argv = ["nsenter", f"--net=/var/run/netns/{_NS}{k}", "dockerd"]
    argv += ["--data-root", f"/var/lib/docker-host{k}", "--exec-root", f"/var/run/docker-host{k}"]
    argv += ["--label", f"lab.host=host{k}", "-H", f"unix://{_sock(k)}"]
    argv += ["--pidfile", f"/var/run/docker-host{k}.pid"]
    with open(f"/var/log/docker-host{k}.log", "ab") as log:
        subprocess.Popen(
            argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True
        )
    deadline = time.monotonic() + _START_S
    while not _answers(k):
        if time.monotonic() > deadline:
            from lab.engine.client import LabError

            raise LabError(
                f"host{k}'s dockerd did not answer within {_START_S:g} s: see "
                f"/var/log/docker-host{k}.log"
            )
        time.sleep(0.5)


def _remove(k: int) -> None:
    docker = ("docker", "-H", f"unix://{_sock(k)}")
    pidfile = Path(f"/var/run/docker-host{k}.pid")
    if pidfile.exists():
        _sh(*docker, "swarm", "leave", "--force", check=False)
        ids = _sh(*docker, "ps", "-aq", check=False).stdout.split()
        if ids:
            _sh(*docker, "rm", "-f", *ids, check=False)
        with contextlib.suppress(ValueError, ProcessLookupError):
            os.kill(int(pidfile.read_text()), signal.SIGTERM)
        deadline = time.monotonic() + 15
        while pidfile.exists() and time.monotonic() < deadline:  # dockerd removes it on exit
            time.sleep(0.5)
    _sh("ip", "link", "del", f"vh{k}", check=False)
    _sh("ip", "netns", "del", f"{_NS}{k}", check=False)
    for path in (f"/var/lib/docker-host{k}", f"/var/run/docker-host{k}"):
        shutil.rmtree(path, ignore_errors=True)
    Path(_sock(k)).unlink(missing_ok=True)


def run(p: EnginesPlan) -> list[str]:
    """The lines to print."""
    if p.action == "env":
        return [f"DOCKER_HOST=unix://{_sock(p.count)}"]
    if p.action == "down":
        gone = _namespaces()
        for k in gone:
            _remove(k)
        _sh("iptables", "-D", "FORWARD", "-i", "vh+", "-o", "vh+", "-j", "ACCEPT", check=False)
        return [f"removed host{k}" for k in gone] or ["no extra engines to remove"]
    lines = []
    for k in range(1, p.count + 1):
        _link(k)
        _start_engine(k)
        lines.append(f"host{k}: unix://{_sock(k)}, address 10.77.{k}.2")
    hosts = [f"unix:///var/run/docker.sock {_HOST0}"]
    hosts += [f"unix://{_sock(k)}" for k in range(1, p.count + 1)]
    if p.hosts_file is not None:
        p.hosts_file.write_text("\n".join(hosts) + "\n")
        lines.append(f"wrote {p.hosts_file}: pass it as --hosts {p.hosts_file}")
    else:
        lines += ["a --hosts file for this machine's engine and these:", *hosts]
    return lines


def report(lines: list[str]) -> int:
    print("\n".join(lines))
    return 0
