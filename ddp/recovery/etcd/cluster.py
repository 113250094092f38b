"""A job's own etcd cluster on this host: three members on loopback, mutual TLS from a CA made
for this job, data in a directory removed at exit.

Why a cluster per job and client certificates: the store a live job coordinates through is
the job's single most attackable surface (a process with no credentials that could write one
key to torch's ``TCPStore`` ended a live job). etcd replicates every write through Raft, so
losing one member loses nothing, and with ``--client-cert-auth`` a process that does not hold
a certificate signed by the job's CA cannot open a session, on the client or the peer port.
The CA's key is thrown away with the directory: nobody can sign a certificate for this job
after it ends.

Timing: etcd's defaults (100 ms heartbeats, 1 s elections) are for real networks; on loopback
a member's loss is noticed and a new leader elected within about a quarter second with the
short settings below, which is what keeps kill -> next quorum short.
"""

from __future__ import annotations

import contextlib
import ctypes
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from ddp.recovery.etcd.client import Credentials, Etcd, EtcdError
from ddp.recovery.etcd.ready import wait_ready

__all__ = ["EmbeddedEtcd", "etcd_binary", "make_certificates", "member_argv"]

MISSING_ETCD = (
    "live recovery needs etcd: apt-get install -y etcd-server (Debian), or put etcd on PATH"
)
_DEBIAN_ETCD = "/usr/bin/etcd"
_HEARTBEAT_MS = 25
_ELECTION_MS = 250


def etcd_binary() -> str:
    """The etcd server to run: ``$DDP_ETCD_BINARY``, else ``etcd`` on ``PATH``, else the Debian
    package's ``/usr/bin/etcd``; one line saying what to install when there is none."""
    for candidate in (os.environ.get("DDP_ETCD_BINARY"), shutil.which("etcd"), _DEBIAN_ETCD):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise FileNotFoundError(MISSING_ETCD)


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        raise RuntimeError(f"openssl {args[0]} failed: {done.stderr.strip().splitlines()[-1:]}")


def make_certificates(directory: Path, addresses: Sequence[str] = ("127.0.0.1",)) -> Path:
    """A CA, one certificate for every member (server and peer, valid for ``addresses``) and
    one client certificate, in ``directory``; returns the directory of the client's three files
    (the ``Credentials.from_directory`` shape). The CA's key stays in ``directory`` and dies
    with it.

    P-256 keys: generated in milliseconds, where RSA keys would cost a job's start a second."""
    for address in addresses:
        ipaddress.ip_address(address)  # ValueError: the certificate names IP addresses only
    directory.mkdir(parents=True, exist_ok=True)
    names = ",".join([*(f"IP:{a}" for a in addresses), "DNS:localhost"])
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    _openssl("req", "-x509", *ec, "-keyout", "ca-key.pem", "-out", "ca.pem", "-days", "2",
             "-subj", "/CN=ddp job CA", cwd=directory)  # fmt: skip
    uses = {
        "server": f"subjectAltName={names}\nextendedKeyUsage=serverAuth,clientAuth\n",
        "client": "extendedKeyUsage=clientAuth\n",
    }
    for name, extensions in uses.items():
        (directory / f"{name}.ext").write_text(extensions)
        _openssl("req", *ec, "-keyout", f"{name}-key.pem", "-out", f"{name}.csr",
                 "-subj", f"/CN=ddp {name}", cwd=directory)  # fmt: skip
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca-key.pem",
                 "-CAcreateserial", "-days", "2", "-extfile", f"{name}.ext",
                 "-out", f"{name}.pem", cwd=directory)  # fmt: skip
    client = directory / "client"
    client.mkdir(exist_ok=True)
    for source, target in (("ca.pem", "ca.pem"), ("client.pem", "client.pem"),
                           ("client-key.pem", "client-key.pem")):  # fmt: skip
        shutil.copy(directory / source, client / target)
    for key in directory.rglob("*key.pem"):
        key.chmod(0o600)
    return client


def member_argv(
    binary: str,
    name: str,
    client_url: str,
    peer_url: str,
    cluster: str,
    token: str,
    data_dir: Path | str,
    tls: Path | str,
) -> list[str]:
    """One member of a new cluster: its URLs, the whole ``cluster`` (``name=peer_url,...``),
    and the files of :func:`make_certificates` in ``tls`` (the server's certificate serves the
    peer port too); mutual TLS on both ports, so no client or peer without the job's
    certificate is heard. Here and in the lab's containers alike."""
    tls = Path(tls)
    return [
        binary,
        f"--name={name}",
        f"--data-dir={data_dir}",
        f"--listen-client-urls={client_url}",
        f"--advertise-client-urls={client_url}",
        f"--listen-peer-urls={peer_url}",
        f"--initial-advertise-peer-urls={peer_url}",
        f"--initial-cluster={cluster}",
        f"--initial-cluster-token={token}",
        "--initial-cluster-state=new",
        f"--heartbeat-interval={_HEARTBEAT_MS}",
        f"--election-timeout={_ELECTION_MS}",
        f"--cert-file={tls / 'server.pem'}",
        f"--key-file={tls / 'server-key.pem'}",
        f"--trusted-ca-file={tls / 'ca.pem'}",
        "--client-cert-auth",
        f"--peer-cert-file={tls / 'server.pem'}",
        f"--peer-key-file={tls / 'server-key.pem'}",
        f"--peer-trusted-ca-file={tls / 'ca.pem'}",
        "--peer-client-cert-auth",
        "--logger=zap",
        "--log-outputs=stderr",
        "--log-level=warn",
    ]


def _die_with_parent() -> None:
    """In the child, before etcd starts: SIGKILL it when the process that started it dies, so
    a launcher killed outright (no ``__exit__``) leaves no etcd behind (Linux's
    ``PR_SET_PDEATHSIG``; elsewhere the cluster lives until it is killed)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _free_ports(count: int) -> list[int]:
    """Ports the kernel says are free now. Another process may take one before etcd binds it;
    ``EmbeddedEtcd`` then fails to start and says which member did not come up."""
    sockets = [socket.socket() for _ in range(count)]
    try:
        for s in sockets:
            s.bind(("127.0.0.1", 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


@dataclass
class _Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    process: subprocess.Popen | None = None
    log: Path | None = None

    @property
    def client_url(self) -> str:
        return f"https://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"https://127.0.0.1:{self.peer_port}"


@dataclass
class EmbeddedEtcd:
    """``members`` etcd processes on loopback for one job, as a context manager: started and
    healthy on enter, every process killed and the directory removed on exit.

    ``directory=None`` makes a temporary one; a given directory is used (and removed) as is.
    ``start_timeout_s`` bounds the wait for the cluster's first leader."""

    members: int = 3
    directory: Path | None = None
    start_timeout_s: float = 20.0
    credentials: Credentials = field(init=False)
    _members: list[_Member] = field(init=False, default_factory=list)
    _made_directory: bool = field(init=False, default=False)

    def __post_init__(self) -> None:
        if self.members < 1:
            raise ValueError(f"an etcd cluster needs at least one member, not {self.members}")
        if self.start_timeout_s <= 0:
            raise ValueError(f"start_timeout_s must be positive, not {self.start_timeout_s}")

    def __enter__(self) -> EmbeddedEtcd:
        binary = etcd_binary()
        if self.directory is None:
            self.directory = Path(tempfile.mkdtemp(prefix="ddp-etcd-"))
            self._made_directory = True
        try:
            self._start(binary)
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for member in self._members:
            self._stop(member)
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)

    def _start(self, binary: str) -> None:
        assert self.directory is not None
        tls = self.directory / "tls"
        client_dir = make_certificates(tls)
        ports = _free_ports(2 * self.members)
        self._members = [
            _Member(f"m{i}", ports[2 * i], ports[2 * i + 1], self.directory / f"m{i}")
            for i in range(self.members)
        ]
        cluster = ",".join(f"{m.name}={m.peer_url}" for m in self._members)
        token = f"ddp-{os.getpid()}-{time.monotonic_ns()}"
        for member in self._members:
            self._spawn(binary, member, cluster, token, tls)
        self.credentials = Credentials.from_directory(
            [m.client_url for m in self._members], client_dir
        )
        self._wait_healthy()

    def _spawn(self, binary: str, m: _Member, cluster: str, token: str, tls: Path) -> None:
        args = member_argv(
            binary, m.name, m.client_url, m.peer_url, cluster, token, m.data_dir, tls
        )
        m.log = self.directory / f"{m.name}.log"
        with open(m.log, "wb") as log:
            m.process = subprocess.Popen(
                args,
                stdout=subprocess.DEVNULL,
                stderr=log,
                start_new_session=True,
                preexec_fn=_die_with_parent,
            )

    def _wait_healthy(self) -> None:
        def exited() -> None:
            for m in self._members:
                assert m.process is not None
                if m.process.poll() is not None:
                    raise EtcdError(
                        f"etcd member {m.name} exited with {m.process.returncode} at start: "
                        f"{self._tail(m)}"
                    )

        wait_ready(self.credentials, self.start_timeout_s, exited)

    @staticmethod
    def _tail(m: _Member) -> str:
        lines = m.log.read_text(errors="replace").strip().splitlines() if m.log else []
        return lines[-1] if lines else "(no output)"

    @staticmethod
    def _stop(m: _Member) -> None:
        if m.process is None or m.process.poll() is not None:
            return
        m.process.kill()
        m.process.wait(timeout=10)

    def kill(self, index: int) -> None:
        """Kill member ``index`` (SIGKILL), as a host's loss would."""
        self._stop(self._members[index])

    def pids(self) -> list[int]:
        """The members' process ids (a live member's; a killed one's too)."""
        return [m.process.pid for m in self._members if m.process is not None]

    def endpoints(self) -> list[str]:
        return [m.client_url for m in self._members]

    def env(self) -> dict[str, str]:
        """The two variables a process needs to reach this cluster (``Credentials.from_env``)."""
        return self.credentials.env()

    def leader(self, timeout_s: float = 2.0) -> int:
        """The index of the member that leads now (asked of every live member)."""
        client = Etcd(self.credentials, timeout_s=timeout_s)
        return self.endpoints().index(client.leader_endpoint())
