"""The etcd control plane against a real three-member etcd with mutual TLS: the client's keys,
transactions, leases and watches; a stranger on this host refused on every port the cluster
opens; one member lost survives, two lost stop with ``EtcdUnavailable``; ``EtcdStore`` answers
as torch's own store does, and two gloo ranks meet through it."""

from __future__ import annotations

import http.client
import json
import shutil
import socket
import ssl
import subprocess
import sys
import threading
import time
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
import torch
import torch.distributed as dist

from ddp.recovery.etcd import cluster as cluster_module
from ddp.recovery.etcd.client import (
    Credentials,
    Etcd,
    EtcdUnavailable,
    create_revision_equals,
    mod_revision_equals,
    put_op,
    range_op,
    value_equals,
)
from ddp.recovery.etcd.cluster import MISSING_ETCD, EmbeddedEtcd, etcd_binary, make_certificates
from ddp.recovery.etcd.store import EtcdStore
from tests.helpers import run_ranks

ROOT = Path(__file__).parents[2]

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def etcd():
    try:
        etcd_binary()
    except FileNotFoundError as err:
        pytest.fail(str(err))  # CI installs etcd-server: a missing one is a broken set-up
    with EmbeddedEtcd() as cluster:
        yield cluster


@pytest.fixture
def client(etcd):
    return Etcd(etcd.credentials, timeout_s=5)


def test_keys_and_a_transaction_that_holds_once(client):
    first = client.put("/t/kv/a", b"1")
    assert client.get("/t/kv/a").value == b"1"
    assert client.get("/t/kv/a").mod_revision == first
    assert client.get("/t/kv/missing") is None
    client.put("/t/kv/b", "2")
    kvs, revision = client.range("/t/kv/")
    assert [kv.key for kv in kvs] == [b"/t/kv/a", b"/t/kv/b"]
    assert revision >= first
    # Two writers race for one key with the same compare: exactly one wins.
    wins = [
        client.txn([create_revision_equals("/t/kv/leader", 0)], [put_op("/t/kv/leader", who)])[0]
        for who in ("x", "y")
    ]
    assert wins == [True, False]
    ok, responses, _ = client.txn(
        [value_equals("/t/kv/leader", "y")],
        [put_op("/t/kv/leader", "z")],
        [range_op("/t/kv/leader")],
    )
    assert not ok and responses[0]["response_range"]["kvs"][0].value == b"x"
    stale = client.get("/t/kv/leader").mod_revision - 1
    assert not client.txn(
        [mod_revision_equals("/t/kv/leader", stale)], [put_op("/t/kv/leader", "w")]
    )[0]
    assert client.delete("/t/kv/", prefix=True) == 3
    assert client.range("/t/kv/")[0] == []


def test_a_watch_from_a_revision_sees_every_later_change_in_order(client):
    _, revision = client.get_with_revision("/t/w/x")
    client.put("/t/w/x", "1")  # written before the watch exists: still seen
    with client.watch("/t/w/", start_revision=revision + 1, prefix=True) as watch:
        client.put("/t/w/y", "2")
        client.delete("/t/w/x")
        events = [watch.next(5) for _ in range(3)]
        assert [(e.type, e.kv.key, e.kv.value) for e in events] == [
            ("PUT", b"/t/w/x", b"1"),
            ("PUT", b"/t/w/y", b"2"),
            ("DELETE", b"/t/w/x", b""),
        ]
        assert watch.next(0.2) is None


def test_a_lease_keeps_its_key_while_renewed_and_takes_it_when_it_lapses(client):
    lease, ttl = client.lease_grant(1)
    assert ttl >= 1
    client.put("/t/lease/member", "alive", lease=lease)
    for _ in range(6):  # 1.5 s of renewals outlive the 1 s TTL
        assert client.lease_keepalive(lease) >= 1
        time.sleep(0.25)
    assert client.get("/t/lease/member").lease == lease
    _, revision = client.get_with_revision("/t/lease/member")
    with client.watch("/t/lease/member", start_revision=revision + 1) as watch:
        event = watch.next(ttl + 3)  # no more renewals: the lease lapses and takes the key
    assert event is not None and event.type == "DELETE"
    assert client.lease_keepalive(lease) == 0
    lease, _ = client.lease_grant(5)
    client.put("/t/lease/gone", "x", lease=lease)
    client.lease_revoke(lease)
    assert client.get("/t/lease/gone") is None


def _listening_ports(pids: list[int]) -> set[int]:
    ports = set()
    for pid in pids:
        for conn in psutil.Process(pid).net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN:
                ports.add(conn.laddr.port)
    return ports


def _stranger_put(port: int, context: ssl.SSLContext | None) -> int | str:
    """What a process on this host gets when it asks ``port`` to write ``/ddp/owned``."""
    body = json.dumps({"key": "L2RkcC9vd25lZA==", "value": "c3RyYW5nZXI="})  # /ddp/owned
    try:
        if context is None:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=3)
        else:
            conn = http.client.HTTPSConnection("127.0.0.1", port, timeout=3, context=context)
        conn.request("POST", "/v3/kv/put", body, {"Content-Type": "application/json"})
        return conn.getresponse().status
    except (OSError, http.client.HTTPException) as err:
        return type(err).__name__


def test_a_stranger_on_this_host_writes_nothing_through_any_port(etcd, client, tmp_path):
    ports = _listening_ports(etcd.pids())
    assert len(ports) >= 6, ports  # a client and a peer port per member
    no_certificate = ssl.create_default_context()
    no_certificate.check_hostname = False
    no_certificate.verify_mode = ssl.CERT_NONE
    # A certificate of the stranger's own making: a CA of its own, a client it signed.
    foreign = make_certificates(tmp_path / "stranger")
    own_ca = ssl.create_default_context()
    own_ca.check_hostname = False
    own_ca.verify_mode = ssl.CERT_NONE
    own_ca.load_cert_chain(foreign / "client.pem", foreign / "client-key.pem")
    answers = {}
    for port in sorted(ports):
        for name, context in (("http", None), ("tls", no_certificate), ("own-ca", own_ca)):
            answers[port, name] = _stranger_put(port, context)
        with socket.create_connection(("127.0.0.1", port), timeout=3) as raw:
            raw.sendall(b"\x16\x03\x01\xff\xff" + b"A" * 4096)  # a forged TLS record
    accepted = {where: said for where, said in answers.items() if said == 200}
    assert not accepted, f"a stranger's write was answered 200 on {accepted}"
    assert client.get("/ddp/owned") is None
    client.put("/t/still", "ok")  # and the cluster still serves the job
    assert client.get("/t/still").value == b"ok"


def test_one_member_lost_is_survived_and_two_lost_stop_with_unavailable():
    with EmbeddedEtcd() as cluster:
        client = Etcd(cluster.credentials, timeout_s=4)
        client.put("/t/durable", "before")
        first = cluster.leader()
        cluster.kill(first)
        client.put("/t/durable", "after one")  # a new leader, elected among the two left
        assert client.get("/t/durable").value == b"after one"
        cluster.kill(next(i for i in range(3) if i != first))
        started = time.monotonic()
        with pytest.raises(EtcdUnavailable, match="no endpoint answered"):
            client.put("/t/durable", "after two")
        assert time.monotonic() - started < 4 + 1


def test_a_silent_member_is_stepped_around_and_its_watches_end():
    """A member that stops answering without closing anything (SIGSTOP here; in the lab a
    killed container, whose address answers nothing) costs a client one attempt, not one per
    call: the next calls, from any thread, start at a member that answers; and a watch
    streaming from the silent member ends, to be opened again elsewhere, instead of staying
    silent for ever (its owner would never hear of an abort)."""
    with EmbeddedEtcd() as cluster:
        client = Etcd(cluster.credentials, timeout_s=2)
        lease, _ = client.lease_grant(5)
        silent = next(i for i in range(3) if i != cluster.leader())
        client._preferred = silent
        client.get("/silent/k")  # a kept-alive connection to it, as a running member has
        watch = client.watch("/silent/k")
        assert watch.endpoint == silent
        tried: list[int] = []
        once = client._once

        def spy(index, *args):
            tried.append(index)
            return once(index, *args)

        client._once = spy
        member = psutil.Process(cluster.pids()[silent])
        member.suspend()
        try:
            assert client.lease_keepalive(lease) > 0
            assert tried[0] == silent and tried[-1] != silent and len(tried) == 2
            with pytest.raises(EtcdUnavailable, match="stopped answering"):
                watch.next(1)
            tried.clear()
            threads = [
                threading.Thread(target=client.lease_keepalive, args=(lease,)) for _ in range(4)
            ]
            for t in threads:
                t.start()
            for t in threads:
                t.join(timeout=10)
            assert len(tried) == 4 and silent not in tried
            with client.watch("/silent/k") as again:
                client.put("/silent/k", "v")
                event = again.next(5)
                assert again.endpoint != silent and event is not None and event.kv.value == b"v"
        finally:
            member.resume()
            watch.close()


_HOLDER = """
import sys, time
from ddp.recovery.etcd.cluster import EmbeddedEtcd
cluster = EmbeddedEtcd().__enter__()
print(*cluster.pids(), cluster.directory, flush=True)
time.sleep(60)
"""


def test_a_launcher_killed_outright_leaves_no_etcd_running():
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER], stdout=subprocess.PIPE, text=True, cwd=ROOT
    )
    try:
        *pids, directory = holder.stdout.readline().split()
    finally:
        holder.kill()  # SIGKILL: no __exit__ runs
        holder.wait(timeout=10)
    try:
        deadline = time.monotonic() + 5
        alive = [int(p) for p in pids]
        while alive and time.monotonic() < deadline:
            alive = [p for p in alive if psutil.pid_exists(p) and not _zombie(p)]
            time.sleep(0.05)
        assert len(pids) == 3 and alive == [], alive
    finally:
        shutil.rmtree(directory, ignore_errors=True)  # the directory stays: only etcd dies


def _zombie(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_credentials_say_what_is_missing(tmp_path, monkeypatch):
    with pytest.raises(ValueError, match="DDP_ETCD_ENDPOINTS and DDP_ETCD_CREDENTIALS not set"):
        Credentials.from_env({})
    with pytest.raises(ValueError, match="does not exist"):
        Credentials.from_env(
            {"DDP_ETCD_ENDPOINTS": "https://127.0.0.1:1", "DDP_ETCD_CREDENTIALS": str(tmp_path)}
        )
    with pytest.raises(ValueError, match="is not https://host:port"):
        Credentials.from_directory(["http://127.0.0.1:2379"], tmp_path)
    monkeypatch.setenv("DDP_ETCD_BINARY", str(tmp_path / "no-etcd"))
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(cluster_module, "_DEBIAN_ETCD", str(tmp_path / "no-etcd"))
    with pytest.raises(FileNotFoundError) as missing:
        EmbeddedEtcd().__enter__()
    assert str(missing.value) == MISSING_ETCD


def _same_answers(store: dist.Store) -> list:
    """One sequence of store calls; torch's HashStore is the reference for the answers."""
    store.set("k", "v")
    answers = [store.get("k"), store.add("n", 3), store.add("n", -1), store.get("n")]
    answers += [store.compare_set("k", "v", "w"), store.compare_set("k", "v", "x"), store.get("k")]
    answers += [store.compare_set("new", "", "made"), store.compare_set("absent", "e", "d")]
    answers += [store.check(["k", "n"]), store.check(["k", "nope"])]
    answers += [store.delete_key("k"), store.delete_key("k"), store.check(["k"])]
    answers += [store.num_keys()]
    store.set("bytes", b"\x00\xff")
    answers += [store.get("bytes")]
    return answers


def test_the_store_answers_as_torchs_own_store(client):
    reference = _same_answers(dist.HashStore())
    ours = _same_answers(EtcdStore(client, "/t/store/parity/"))
    assert ours == reference
    base = EtcdStore(client, "/t/store/prefixed/")  # kept: see EtcdStore's docstring
    prefixed = dist.PrefixStore("job/", base)
    prefixed.set("a", "1")
    assert prefixed.get("a") == b"1"
    kvs, _ = client.range("/t/store/prefixed/job/")  # the one key, under both prefixes
    assert [(kv.key.endswith(b"/a"), kv.value) for kv in kvs] == [(True, b"1")]


def test_the_store_waits_for_a_key_and_times_out_saying_which(client):
    store = EtcdStore(client, "/t/store/wait/", timeout=timedelta(seconds=1))
    started = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="'/t/store/wait/late' was not set within 1 s"):
        store.get("late")
    assert 1 <= time.monotonic() - started < 3
    # A key set while the reader waits wakes it.
    threading.Timer(0.3, lambda: Etcd(client.credentials).put("/t/store/wait/later", "x")).start()
    assert store.get("later") == b"x"


def _allreduce_through_etcd(rdzv, credentials: Credentials, prefix: str) -> float:
    base = EtcdStore(Etcd(credentials, timeout_s=5), prefix)
    store = dist.PrefixStore("pg/0/", base)
    dist.init_process_group(
        "gloo",
        store=store,
        rank=rdzv.rank,
        world_size=rdzv.world_size,
        timeout=timedelta(seconds=30),
    )
    try:
        value = torch.tensor([float(rdzv.rank + 1)])
        dist.all_reduce(value)
        return value.item()
    finally:
        dist.destroy_process_group()


def test_two_gloo_ranks_meet_through_the_store(etcd, tmp_path):
    sums = run_ranks(
        _allreduce_through_etcd, 2, tmp_path, etcd.credentials, "/t/gloo/", timeout_s=60
    )
    assert sums == {0: 3.0, 1: 3.0}


def test_the_members_certificate_names_the_addresses_it_serves(tmp_path):
    """The lab's members listen on their containers' addresses: the server certificate must
    name exactly those (and loopback's name), or every client's TLS check refuses them."""
    make_certificates(tmp_path / "tls", ["10.1.2.3", "10.1.2.4"])
    text = subprocess.run(
        ["openssl", "x509", "-in", str(tmp_path / "tls" / "server.pem"), "-noout", "-text"],
        capture_output=True, text=True, timeout=30, check=True,
    ).stdout  # fmt: skip
    assert "IP Address:10.1.2.3, IP Address:10.1.2.4, DNS:localhost" in text
    assert "127.0.0.1" not in text
    with pytest.raises(ValueError, match="does not appear to be an IPv4 or IPv6 address"):
        make_certificates(tmp_path / "bad", ["node5"])
