"""Failpoints (``ddp.recovery.failpoints``): the spec, and a real process that kills or stops
itself at a named moment and says when in its log. Torch-free processes: under a second."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from ddp.recovery.failpoints import ENV, LOG_ENV, Armed, parse, read_fired, spec

_CALL = (
    "from ddp.recovery.failpoints import failpoint\n"
    "failpoint('heal.sending', step=3)\n"
    "failpoint('step.voted', step=4)\n"
    "print('went on', flush=True)\n"
)


def _run(armed: str, log: str, **kw) -> subprocess.Popen:
    env = {**os.environ, ENV: armed, LOG_ENV: log}
    return subprocess.Popen(
        [sys.executable, "-c", _CALL], env=env, stdout=subprocess.PIPE, text=True, **kw
    )


def test_spec_round_trips_through_parse():
    text = ";".join([spec("step.voted", step=12), spec("rank.registering", "stop"), "heal.sending"])
    assert text == "step.voted@step=12;rank.registering:stop;heal.sending"
    assert parse(text) == {
        "step.voted": Armed("step.voted", {"step": "12"}),
        "rank.registering": Armed("rank.registering", {}, "stop"),
        "heal.sending": Armed("heal.sending", {}, "kill"),
    }
    assert parse("") == {}


@pytest.mark.parametrize("bad", ["heal.sending:explode", "@step=3", "step.voted@step", ":kill"])
def test_a_bad_spec_is_refused_in_one_line(bad):
    with pytest.raises(ValueError, match=ENV) as e:
        parse(bad)
    assert "\n" not in str(e.value)


def test_an_armed_failpoint_kills_its_process_and_logs_when(tmp_path):
    log = str(tmp_path / "fired.jsonl")
    before = time.time()
    p = _run("step.voted@step=4", log)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == -signal.SIGKILL and "went on" not in out
    [fired] = read_fired(log)
    assert (fired.name, fired.action, fired.pid) == ("step.voted", "kill", p.pid)
    assert fired.context == {"step": "4"} and before <= fired.t <= time.time()


def test_a_failpoint_whose_condition_does_not_match_stays_silent(tmp_path):
    log = str(tmp_path / "fired.jsonl")
    p = _run("step.voted@step=5;other.moment", log)
    out, _ = p.communicate(timeout=60)
    assert p.returncode == 0 and "went on" in out
    assert read_fired(log) == []


def test_a_stop_failpoint_stalls_until_continued(tmp_path):
    log = str(tmp_path / "fired.jsonl")
    p = _run("heal.sending:stop", log)
    try:
        deadline = time.monotonic() + 60
        while not read_fired(log):
            assert time.monotonic() < deadline and p.poll() is None, "never stopped"
            time.sleep(0.01)
        # Stopped: it neither exits nor prints until SIGCONT.
        time.sleep(0.2)
        assert p.poll() is None
        os.kill(p.pid, signal.SIGCONT)
        out, _ = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    assert p.returncode == 0 and "went on" in out
    assert [f.name for f in read_fired(log)] == ["heal.sending"]  # fired once
