"""Spawning local ranks: a rank that raises ends the run, and leaves nothing in /tmp."""

import glob

import pytest
import torch.multiprocessing as mp

from tests.helpers import run_ranks


def _boom(rdzv) -> None:
    if rdzv.rank == 1:
        raise KeyError("bucket 7")


@pytest.mark.timeout(120)
def test_a_raising_rank_is_reported_and_leaves_no_error_file(tmp_path):
    before = set(glob.glob("/tmp/pytorch-errorfile-*"))
    with pytest.raises(mp.ProcessRaisedException, match="bucket 7"):
        run_ranks(_boom, 2, tmp_path, timeout_s=90)
    assert set(glob.glob("/tmp/pytorch-errorfile-*")) - before == set()


def _big(rdzv) -> str:
    return str(rdzv.rank) * (1 << 20)  # 1 MiB: far more than a pipe holds


@pytest.mark.timeout(120)
def test_results_larger_than_a_pipe_come_back(tmp_path):
    results = run_ranks(_big, 2, tmp_path, timeout_s=60)
    assert {rank: (len(v), v[0]) for rank, v in results.items()} == {
        0: (1 << 20, "0"),
        1: (1 << 20, "1"),
    }
