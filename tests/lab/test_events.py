"""How lab reads a run's output streams: early exits, a broken verdict, timeouts.

The streams are scripted here (the docker tier runs the real engine); what is tested is the
decision logic on top of them.
"""

import pytest

from lab.cluster import NodeHandle
from lab.engine import NodeFailed, RunTimeout
from lab.watch import parse_line, watch


class _ScriptedContainer:
    def __init__(self, lines, status=0, hang=False):
        self._lines, self._status, self._hang = lines, status, hang

    def logs(self, stream, follow):
        data = "".join(line + "\n" for line in self._lines).encode()
        # Chunks that split lines: the reader must reassemble them.
        yield from (data[i : i + 7] for i in range(0, len(data), 7))
        if self._hang:
            import time

            time.sleep(30)

    def wait(self, timeout):
        return {"StatusCode": self._status}


def _nodes(*scripts):
    return [NodeHandle(i, ranks, _ScriptedContainer(*s)) for i, (ranks, *s) in enumerate(scripts)]


def _verdict(text):
    return text.startswith("parity")


def test_parse_line():
    assert parse_line("[node1/rank3] step 2") == (1, 3, "step 2")
    assert parse_line("[node0] no go file") == (0, None, "no go file")
    assert parse_line("plain") == (None, None, "plain")


def test_all_ranks_exit_zero():
    seen = []
    nodes = _nodes(
        ([0], ["[node0/rank0] row 1", "[node0/rank0] parity holds", "[node0/rank0] exit 0 "
               "(cpu 1.50 s, peak rss 300 MiB)"]),
        ([1], ["[node1/rank1] exit 0 (cpu 1.25 s, peak rss 290 MiB)"]),
    )  # fmt: skip
    out = watch(nodes, 10, on_line=lambda *a: seen.append(a), is_verdict=_verdict)
    assert out.exits == {0: 0, 1: 0}
    assert out.usage == {0: (1.5, 300.0), 1: (1.25, 290.0)}
    assert seen == [(0, 0, "row 1"), (0, 0, "parity holds")]


def test_broken_parity_is_a_finished_run_not_an_early_exit():
    nodes = _nodes(
        ([0], ["[node0/rank0] parity broken: replicas diverged", "[node0/rank0] exit 1"]),
        ([1], ["[node1/rank1] exit 1"]),
    )
    assert watch(nodes, 10, is_verdict=_verdict, grace_s=2).exits == {0: 1, 1: 1}


def test_early_exit_names_the_rank_and_shows_its_last_lines():
    nodes = _nodes(
        ([0], ["[node0/rank0] step 1"], 0, True),  # still running: never exits
        ([1], ["[node1/rank1] Traceback", "[node1/rank1] RuntimeError: boom",
               "[node1/rank1] exit 1"], 1),
    )  # fmt: skip
    with pytest.raises(NodeFailed) as err:
        watch(nodes, 20, is_verdict=_verdict, grace_s=0.5)
    msg = str(err.value)
    assert "rank 1 exited early with code 1 while ranks [0] were still running" in msg
    assert "RuntimeError: boom" in msg


def test_a_container_that_dies_silently_fails_its_ranks():
    nodes = _nodes(([0, 1], ["[node0/rank0] step 1"], 137))
    with pytest.raises(NodeFailed, match="rank 0 exited early with code 137"):
        watch(nodes, 10, is_verdict=_verdict, grace_s=0.2)


def test_timeout_lists_the_ranks_still_running():
    nodes = _nodes(([0], ["[node0/rank0] step 1"], 0, True), ([1], ["[node1/rank1] exit 0"]))
    with pytest.raises(RunTimeout, match=r"within 0.5 s; ranks still running: \[0\]"):
        watch(nodes, 0.5, is_verdict=_verdict)
