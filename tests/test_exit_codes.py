"""ddp's exit-code table and the one the compose summary prints from (``lab.node.summary``,
standard library only inside the container, so it keeps its own copy) must agree: the same
codes, and each of the lab's meanings starting with ddp's."""

from __future__ import annotations

from ddp.program.outcome import EXIT_CODES
from lab.node.summary import MEANING


def test_lab_node_summary_knows_every_ddp_exit_code():
    assert sorted(MEANING) == sorted(EXIT_CODES)


def test_lab_node_summary_says_what_ddp_says():
    for code, meaning in EXIT_CODES.items():
        assert MEANING[code].startswith(meaning), (code, MEANING[code], meaning)
