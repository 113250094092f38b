"""compose.yaml is generated from TrainConfig and must be current; the summary line."""

import dataclasses
from pathlib import Path

import yaml

from ddp.program.config import TrainConfig
from lab.node.summary import summary_line
from lab.tools.compose import env_name, render

ROOT = Path(__file__).resolve().parents[2]


def test_checked_in_compose_file_is_the_generated_one():
    assert (ROOT / "compose.yaml").read_text() == render(), "run: python -m lab compose"


def test_every_training_setting_is_an_environment_variable_with_ddps_default():
    entry = yaml.safe_load(render())["x-node"]["entrypoint"][2]
    train = [f for f in dataclasses.fields(TrainConfig) if f.metadata["group"] == "train"]
    for f in train:
        if isinstance(f.default, bool):
            assert f"${{{env_name(f.name)}:+--" in entry
        else:
            shown = repr(f.default) if isinstance(f.default, float) else str(f.default)
            assert f"${{{env_name(f.name)}:-{shown}}}" in entry, f.name
    assert env_name("overlap") == "NO_OVERLAP" and env_name("bucket_cap_mb") == "BUCKET_CAP_MB"
    assert "${COLLECTIVE_TIMEOUT:-300.0}" in entry


def test_summary_line():
    assert summary_line({"node0": 0, "node1": 0}) == (
        "node exit codes: node0 0, node1 0: parity holds",
        0,
    )
    line, code = summary_line({"node0": 3, "node1": None, "node2": 3})
    assert code == 3 and line == (
        "node exit codes: node0 3, node1 ?, node2 3: a peer died, stalled or never joined"
    )
    assert summary_line({"node0": None})[1] == 1
    assert summary_line({"node0": 1, "node1": 1})[0].endswith("parity broken")
