"""``lab run``'s command line: the fault cues as written, and every bad input refused before
any Docker call (exit 2, one line naming what was wrong)."""

from pathlib import Path

import pytest

from lab.experiments.run.faults import parse_fault
from lab.experiments.run.run import RunPlan, script_of
from tests.helpers import cli_error


def test_the_issue_s_cues_parse() -> None:
    kill = parse_fault("kill:rank=2:at-step=30")
    assert (kill.kind, kill.rank, kill.at_step, kill.at_s) == ("kill", 2, 30, None)
    pause = parse_fault("pause:node=1:at=20s:for=10s")
    assert (pause.node, pause.at_s, pause.for_s, pause.at_step) == (1, 20.0, 10.0, None)
    cut = parse_fault("partition:node=1:at-step=15")
    assert (cut.kind, cut.node, cut.at_step) == ("partition", 1, 15)
    link = parse_fault("link:ms=50:at-step=40")
    assert (link.ms, link.at_step) == (50.0, 40)
    assert parse_fault("pause:node=0:at=7").at_s == 7.0
    assert link.describe() == "link to 50 ms in step 40"
    assert pause.describe() == "pause node1 for 10 s at 20 s"


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("explode:rank=1:at-step=3", "unknown kind 'explode'"),
        ("kill:rank=1", "give exactly one cue"),
        ("kill:rank=1:at-step=3:at=5s", "give exactly one cue"),
        ("kill:at-step=3", "kill needs rank="),
        ("kill:node=1:at-step=3", "kill takes rank, at-step, at, not 'node'"),
        ("kill:rank=x:at-step=3", "rank, node and at-step are integers"),
        ("kill:rank=1:at-step=0", "at-step must be >= 1"),
        ("pause:node=1:at=5s:for=-1", "for must be >= 0"),
        ("pause:node=-1:at=5s", "node must be >= 0"),
        ("link:ms=5:rate-mbit=0:at-step=3", "rate-mbit must be > 0"),
        ("kill:rank:at-step=3", "'rank' is not KEY=VALUE"),
        ("kill:rank=1:rank=2:at-step=3", "rank given twice"),
    ],
)
def test_bad_cues_say_what_is_wrong(text: str, said: str) -> None:
    with pytest.raises(ValueError, match=None) as e:
        parse_fault(text)
    assert said in str(e.value)
    assert text in str(e.value)


def test_the_script_of_a_command() -> None:
    assert script_of(("python", "train.py", "--epochs", "3")) == "train.py"
    assert script_of(("train.py",)) == "train.py"
    assert script_of(("python3", "-u", "x/t.py")) == "x/t.py"
    assert script_of(("python", "-m", "pkg.train")) is None
    assert script_of(("bash", "go.sh")) is None


def test_a_plan_checks_the_workdir(tmp_path: Path) -> None:
    (tmp_path / "train.py").write_text("print('hi')\n")
    plan = RunPlan(("python", "train.py"), workdir=tmp_path, nodes=2, ranks_per_node=2, ms=5)
    assert plan.argv == ["python", "train.py"]
    assert RunPlan(("train.py",), workdir=tmp_path).argv == ["python", "train.py"]
    assert plan.describe().startswith("4 ranks on 2 nodes, 5 ms between nodes")
    (tmp_path / "data.bin").write_bytes(b"\0" * 2_000_000)
    with pytest.raises(ValueError, match="over the 1 MB limit"):
        RunPlan(("train.py",), workdir=tmp_path, max_workdir_mb=1)
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "big").write_bytes(b"\0" * 2_000_000)
    RunPlan(("train.py",), workdir=tmp_path, max_workdir_mb=3)  # .git is never copied


_EXAMPLE = "examples/mlp.py"


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        ("run -- python nothere.py", "no script nothere.py in --workdir"),
        ("run --", "no command: put it after --"),
        (f"run --fault kill:rank=4:at-step=3 -- python {_EXAMPLE}", "rank 4 is out of range"),
        (f"run --fault pause:node=2:at=3s -- python {_EXAMPLE}", "node 2 is out of range"),
        (f"run --fault kill:rank=1 -- python {_EXAMPLE}", "give exactly one cue"),
        (
            f"run --no-instrument --fault kill:rank=1:at-step=3 -- python {_EXAMPLE}",
            "at-step needs the step records",
        ),
        (f"run --requirements /nonexistent.txt -- python {_EXAMPLE}", "no such file"),
        (f"run --workdir /nonexistent -- python {_EXAMPLE}", "is not a directory"),
        ("run --workdir /tmp -- python ../etc/passwd.py", "no script ../etc/passwd.py"),
        (f"run --nodes 0 -- python {_EXAMPLE}", "--nodes: expected an integer >= 1"),
        (f"run --hang-after 0 -- python {_EXAMPLE}", "--hang-after: expected a finite"),
    ],
)
def test_bad_input_is_refused(argv: str, said: str, capsys: pytest.CaptureFixture[str]) -> None:
    err = cli_error(argv.split(), capsys)
    assert said in err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1].startswith("python -m lab run: error:")
