"""Docker tier: ``python -m lab kill --recovery torchft --mode kill --rejoin`` end to end --
torchft's lighthouse in node 4's container, four replicas in four containers, one SIGKILLed by
``docker kill``, the survivors committing without it, a replacement healed from a peer over
torchft's transport -- and the refusal of an image without torchft. Needs an image built with
``python -m lab image --extras torchft --tag ddp-lab:torchft`` and
``LAB_IMAGE=ddp-lab:torchft``; skipped otherwise.
Run with ``LAB_IMAGE=ddp-lab:torchft pytest -m docker tests/docker/test_kill_torchft.py``."""

from __future__ import annotations

import json
import re

import pytest

import docker
from ddp.program.records import load_attempts
from ddp.recovery.records import HealRecord, RecoveryVerdictRecord
from lab.engine.build import EXTRAS_LABEL
from lab.engine.specs import DEFAULT_IMAGE
from tests.docker.lab_run import run_lab

pytestmark = pytest.mark.docker
# the fault both tests pose: torchft's recovery of rank 2, killed in step 6
_FAULT = ["kill", "--recovery", "torchft", "--mode", "kill", "--rank", "2", "--at-step", "6"]


@pytest.mark.timeout(900)
def test_torchft_recovery_with_a_replacement(client, tmp_path):
    labels = client.images.get(DEFAULT_IMAGE).labels or {}
    if "torchft" not in labels.get(EXTRAS_LABEL, "").split(","):
        pytest.skip(f"{DEFAULT_IMAGE} was not built with --extras torchft")
    # 80 steps: the replacement's interpreter and torch import take seconds on a loaded host,
    # and it must find the survivors still training
    argv = [*_FAULT, "--rejoin", "--no-compare", "--steps", "80", "--runs-dir", str(tmp_path)]
    out, run_id = run_lab(client, argv, 850)
    last = out.strip().splitlines()[-1]
    assert re.fullmatch(
        r"torchft recovery: [\d.]+ s from the fault to the first committed step at world [23]; "
        r"rank 2 healed from rank \d in [\d.]+ s; replicas identical after every committed step",
        last,
    ), out
    assert re.search(r"^torchft +[\d.]+ s +[\d.]+ s +\d+", out, re.M), out
    doc = json.loads((tmp_path / run_id / "live.json").read_text())
    assert doc["ok"] and doc["figures"]["heal_from"] in (0, 1, 3)
    replacement = load_attempts(tmp_path / run_id / "rejoin" / "logs")[2][-1].records
    verdict = [r for r in replacement if isinstance(r, RecoveryVerdictRecord)]
    assert len(verdict) == 1 and verdict[0].holds and verdict[0].committed_steps == 80
    heal = [r for r in replacement if isinstance(r, HealRecord)]
    assert heal and heal[0].nbytes > 2_000_000  # the tower's weights and momentum


def test_an_image_without_torchft_is_refused(client, capsys):
    from lab.cli import main

    bare = "lab-base:offline"  # this machine's base image: no lab.extras label at all
    try:
        client.images.get(bare)
    except docker.errors.ImageNotFound:
        pytest.skip(f"needs an image without the lab.extras label: {bare} is not here")
    with pytest.raises(SystemExit) as e:
        main([*_FAULT, "--no-compare", "--image", bare])
    assert e.value.code == 2
    assert f"image {bare} has no torchft" in capsys.readouterr().err
