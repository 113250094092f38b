"""Unit tests of the flight recorder ring buffer and its dumps."""

import json
import threading
import time

import pytest

from ddp.flight.dumps import dump_path, load_dumps, request_dumps
from ddp.flight.recorder import FlightRecorder


def test_seq_numbering_and_states():
    rec = FlightRecorder(rank=1, world_size=4)
    assert rec.last_started_seq == -1
    a = rec.start("broadcast", step=-1, nbytes=40)
    b = rec.start("allreduce", step=0, bucket=3, nbytes=1024)
    c = rec.start("allreduce", step=0, bucket=2, nbytes=512)
    assert (a, b, c) == (0, 1, 2)
    rec.complete(b)  # out-of-order completion is allowed
    rec.fail(c, "boom")
    rec.complete(c)  # a late completion callback must not hide the failure
    recs = rec.records()
    assert [r.seq for r in recs] == [0, 1, 2]
    assert [r.state for r in recs] == ["started", "completed", "failed"]
    assert recs[0].end is None and recs[0].op == "broadcast" and recs[0].step == -1
    assert recs[1].bucket == 3 and recs[1].nbytes == 1024 and recs[1].end >= recs[1].start
    assert recs[2].error == "boom"
    assert rec.last_started_seq == 2


def test_capacity_wrap_keeps_newest_in_order():
    rec = FlightRecorder(rank=0, world_size=2, capacity=4)
    for i in range(10):
        seq = rec.start("allreduce", step=i)
        assert seq == i
        if i % 2 == 0:
            rec.complete(seq)
    recs = rec.records()
    assert [r.seq for r in recs] == [6, 7, 8, 9]
    assert [r.step for r in recs] == [6, 7, 8, 9]
    assert [r.state for r in recs] == ["completed", "started", "completed", "started"]
    rec.complete(1)  # fell out of the buffer: silently ignored
    assert [r.seq for r in rec.records()] == [6, 7, 8, 9]
    with pytest.raises(ValueError, match="never started"):
        rec.complete(10)


def test_records_are_copies():
    rec = FlightRecorder(rank=0, world_size=1)
    seq = rec.start("allreduce", step=0)
    snap = rec.records()
    rec.complete(seq)
    assert snap[0].state == "started"
    assert rec.records()[0].state == "completed"


def test_thread_safety_sanity():
    """Several threads start and complete concurrently: no seq lost or handed out twice."""
    rec = FlightRecorder(rank=0, world_size=1, capacity=100_000)
    seqs: list[list[int]] = [[] for _ in range(4)]

    def work(out: list[int]) -> None:
        for i in range(5000):
            s = rec.start("allreduce", step=i)
            out.append(s)
            rec.complete(s)

    threads = [threading.Thread(target=work, args=(out,)) for out in seqs]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=30)
        assert not t.is_alive()
    every = sorted(s for out in seqs for s in out)
    assert every == list(range(20_000))
    recs = rec.records()
    assert len(recs) == 20_000 and all(r.state == "completed" for r in recs)


def test_bad_arguments(tmp_path):
    with pytest.raises(ValueError, match="rank"):
        FlightRecorder(rank=4, world_size=4)
    with pytest.raises(ValueError, match="capacity"):
        FlightRecorder(rank=0, world_size=4, capacity=0)
    with pytest.raises(ValueError, match="reason"):
        FlightRecorder(rank=0, world_size=1).dump(tmp_path, "crash")
    assert list(tmp_path.iterdir()) == []


def test_dump_load_round_trip(tmp_path):
    recs = []
    for rank in range(3):
        rec = FlightRecorder(rank=rank, world_size=3, capacity=8)
        for i in range(12):
            s = rec.start("allreduce", step=i // 3, bucket=i % 3, nbytes=100 * i)
            if i < 11:
                rec.complete(s)
        path = rec.dump(tmp_path, "timeout" if rank else "exit")
        assert path == dump_path(tmp_path, rank) and path.exists()
        recs.append(rec)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "flight_rank0.json",
        "flight_rank1.json",
        "flight_rank2.json",
    ]  # no temp file left behind
    dumps = load_dumps(tmp_path)
    assert sorted(dumps) == [0, 1, 2]
    d = dumps[1]
    assert d["rank"] == 1 and d["world_size"] == 3 and d["reason"] == "timeout"
    assert dumps[0]["reason"] == "exit"
    assert d["last_started_seq"] == 11 and d["last_completed_seq"] == 10
    assert isinstance(d["pid"], int) and isinstance(d["time"], float)
    assert [r["seq"] for r in d["records"]] == list(range(4, 12))
    assert d["records"][-1]["state"] == "started" and d["records"][-1]["end"] is None
    assert d["records"][0] == {
        "seq": 4,
        "op": "allreduce",
        "step": 1,
        "bucket": 1,
        "nbytes": 400,
        "start": recs[1].records()[0].start,
        "end": recs[1].records()[0].end,
        "state": "completed",
        "error": None,
    }


def test_dump_overwrites_previous(tmp_path):
    rec = FlightRecorder(rank=0, world_size=1)
    rec.start("allreduce", step=0)
    rec.dump(tmp_path, "error")
    rec.start("allreduce", step=1)
    rec.dump(tmp_path, "exit")
    d = load_dumps(tmp_path)[0]
    assert d["reason"] == "exit" and d["last_started_seq"] == 1


def test_corrupt_dumps_are_skipped(tmp_path, caplog):
    good = FlightRecorder(rank=0, world_size=5)
    good.start("allreduce", step=0)
    good.dump(tmp_path, "timeout")
    full = dump_path(tmp_path, 0).read_text()
    dump_path(tmp_path, 1).write_text(full[: len(full) // 2])  # cut short
    dump_path(tmp_path, 2).write_bytes(b"\xff\xfe\x00garbage")  # not text
    dump_path(tmp_path, 3).write_text(full)  # claims rank 0 inside a rank-3 file
    bad = json.loads(full)
    bad["rank"] = 4
    bad["records"][0]["state"] = "weird"
    dump_path(tmp_path, 4).write_text(json.dumps(bad))  # valid JSON, record unusable
    (tmp_path / "flight_rank5.json.tmp").write_text("{")  # someone's temp file: not a dump
    (tmp_path / "notes.txt").write_text("hello")
    with caplog.at_level("WARNING"):
        dumps = load_dumps(tmp_path)
    assert sorted(dumps) == [0]
    warned = caplog.text
    assert "flight_rank1.json" in warned and "flight_rank2.json" in warned
    assert "flight_rank3.json" in warned and "flight_rank4.json" in warned
    assert load_dumps(tmp_path / "does-not-exist") == {}


def test_stale_dumps_are_ignored(tmp_path):
    rec = FlightRecorder(rank=0, world_size=2)
    rec.dump(tmp_path, "exit")
    t = json.loads(dump_path(tmp_path, 0).read_text())["time"]
    assert sorted(load_dumps(tmp_path, newer_than=t - 1)) == [0]
    assert load_dumps(tmp_path, newer_than=t + 1) == {}


def _wait_for(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return predicate()


class _Polls:
    """Counts the polls of ``rec``'s watcher (each poll begins with a wait on its stop event), so
    a test can wait until the watcher has looked at the request file since some moment, and only
    then check what it did not do: a positive signal instead of a sleep that a slow host could
    outlast."""

    def __init__(self, rec: FlightRecorder) -> None:
        self._count = 0
        self._changed = threading.Condition()
        stop = rec._watch_stop
        wait = stop.wait

        def counted(timeout=None):
            with self._changed:
                self._count += 1
                self._changed.notify_all()
            return wait(timeout)

        stop.wait = counted

    def looked(self, timeout_s: float = 5.0) -> bool:
        """Wait until one whole poll ran after this call: the wait that ends the poll under way
        (if any), then a full poll, then the wait after it."""
        with self._changed:
            target = self._count + 2
            return self._changed.wait_for(lambda: self._count >= target, timeout_s)


def test_watcher_ignores_earlier_requests_then_dumps_on_request(tmp_path):
    request_dumps(tmp_path, rank=9)  # left over from an earlier run: must be ignored
    rec = FlightRecorder(rank=1, world_size=2)
    rec.start("allreduce", step=3, bucket=0)
    rec.watch(tmp_path, poll_s=0.01)
    try:
        with pytest.raises(RuntimeError, match="already watching"):
            rec.watch(tmp_path)
        assert _Polls(rec).looked(), "the watcher never polled"
        assert not dump_path(tmp_path, 1).exists()
        request_dumps(tmp_path, rank=0)
        assert _wait_for(lambda: 1 in load_dumps(tmp_path))
        d = load_dumps(tmp_path)[1]
        assert d["reason"] == "requested" and d["records"][0]["state"] == "started"
    finally:
        rec.stop_watching()
    assert not any(t.name.startswith("flight-recorder-watch") for t in threading.enumerate())
    rec.stop_watching()  # idempotent


def test_watcher_keeps_a_final_dump(tmp_path):
    """After its own timeout/error/exit dump, a rank answers requests no more: the final dump
    says more than a requested one."""
    rec = FlightRecorder(rank=1, world_size=2)
    rec.start("allreduce", step=3, bucket=0)
    rec.watch(tmp_path, poll_s=0.01)
    try:
        polls = _Polls(rec)
        rec.dump(tmp_path, "timeout")
        request_dumps(tmp_path, rank=0)
        assert polls.looked(), "the watcher never polled"
        assert load_dumps(tmp_path)[1]["reason"] == "timeout"
    finally:
        rec.stop_watching()


def test_concurrent_requests_from_equal_pids_do_not_collide(tmp_path, monkeypatch):
    # Ranks in different containers often have the same PID (one PID namespace each) and
    # share the dump directory: their requests must not trip over each other's temp files.
    import threading

    from ddp.flight.dumps import request_dumps

    monkeypatch.setattr("os.getpid", lambda: 14)
    errors = []

    def ask(rank):
        try:
            for _ in range(200):
                request_dumps(tmp_path, rank)
        except OSError as e:
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(r,)) for r in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert errors == []
    assert [p.name for p in tmp_path.iterdir()] == ["dump_request.json"]
