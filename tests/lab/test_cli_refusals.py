"""Every bad command line of every command is refused before any Docker call: exit 2, the
subcommand's usage (not the top's), a message naming the flag, and no traceback."""

import pytest

from tests.helpers import cli_error

_KILL = "kill --rank 2 --at-step 5 --mode pause"
_TORCHRUN = "kill --launcher torchrun --mode kill --nodes 2 --procs-per-node 2 --rank 3 --at-step 5"

# The command line (split at spaces) and what its refusal says.
_REFUSED = [
    ("image --nope", "unrecognized arguments: --nope"),
    ("parity", "the following arguments are required: run_dir"),
    ("parity /nonexistent", "/nonexistent not found"),
    # lab up
    ("up --nodes 0", "--nodes: expected an integer >= 1, got '0'"),
    ("up --nodes 3", "--batch-size 64 is not divisible by the world size 3"),
    ("up --ranks-per-node 0", "--ranks-per-node: expected an integer >= 1"),
    ("up --steps 0", "--steps must be >= 1, got 0"),
    ("up --bucket-cap-mb -2", "--bucket-cap-mb must be a number >= 0, got -2.0"),
    ("up --bucket-cap-mb nan", "--bucket-cap-mb must be a number >= 0, got nan"),
    ("up --model huge", "invalid choice: 'huge'"),
    ("up --run-timeout 0", "--run-timeout: expected a finite number > 0"),
    ("up --collective-timeout -1", "--collective-timeout: expected a finite"),
    ("up --steps many", "invalid int value"),
    ("up --topology /nonexistent/t.yaml", "cannot read topology file"),
    # lab kill: each case overrides one flag of a valid command line (later flags win)
    (f"{_KILL} --rank 4", "--rank 4 is out of range: 4 nodes run ranks 0..3"),
    (f"{_KILL} --rank -1", "argument --rank: expected an integer >= 0, got '-1'"),
    (f"{_KILL} --at-step 13", "--at-step 13 is outside the run: it trains steps 1..12"),
    (f"{_KILL} --at-step 0", "argument --at-step: expected an integer >= 1, got '0'"),
    (f"{_KILL} --mode explode", "argument --mode: invalid choice: 'explode'"),
    (f"{_KILL} --collective-timeout 0", "argument --collective-timeout: expected a finite"),
    (f"{_KILL} --run-timeout -3", "argument --run-timeout: expected a finite number > 0"),
    (f"{_KILL} --nodes 1", "argument --nodes: expected an integer >= 2, got '1'"),
    (f"{_KILL} --nodes 3", "--batch-size 64 is not divisible by the world size 3"),
    (f"{_KILL} --recover --checkpoint-every 0", "--recover needs checkpoints"),
    (f"{_KILL} --recover --checkpoint-every 5", "no checkpoint exists before the fault"),
    (f"{_KILL} --step-delay-ms -5", "--step-delay-ms must be a number >= 0"),
    (f"{_KILL} --steps x", "argument --steps: invalid int value: 'x'"),
    (f"{_KILL} --timeout 30", "argument --timeout: was renamed: --collective-timeout S is"),
    # lab kill --launcher torchrun, likewise
    (
        f"{_TORCHRUN} --mode partition",
        "--launcher torchrun supports --mode kill or host, got --mode part",
    ),
    (
        f"{_TORCHRUN} --mode pause",
        "--launcher torchrun supports --mode kill or host, got --mode pause",
    ),
    (f"{_TORCHRUN} --recover", "--recover does not go with --launcher torchrun"),
    (
        f"{_TORCHRUN} --max-restarts 0",
        "--max-restarts 0: torchrun would give up at the first failure",
    ),
    (f"{_TORCHRUN} --rank 4", "--rank 4 is out of range: 2 nodes x 2 workers run ranks 0..3"),
    (f"{_TORCHRUN} --at-step 13", "--at-step 13 is outside the run: it trains steps 1..12"),
    (f"{_TORCHRUN} --checkpoint-every 0", "none exists before the fault with --checkpoint-every 0"),
    (f"{_TORCHRUN} --checkpoint-every 5", "pass 1 <= --checkpoint-every < 5 or a later --at-step"),
    (f"{_TORCHRUN} --at-step 1 --checkpoint-every 1", "pass 1 <= --checkpoint-every < 1 or a"),
    (f"{_TORCHRUN} --procs-per-node 3", "--batch-size 64 is not divisible by the world size 6"),
    (f"{_TORCHRUN} --procs-per-node 0", "argument --procs-per-node: expected an integer >= 1"),
    (f"{_TORCHRUN} --launcher mpirun", "argument --launcher: invalid choice: 'mpirun'"),
    (f"{_TORCHRUN} --run-timeout 0", "argument --run-timeout: expected a finite number > 0"),
    # lab latency
    ("latency --caps 0,x", "--caps: expected comma-separated caps in MB or auto"),
    ("latency --ms -2", "argument --ms: expected a finite number >= 0"),
    ("latency --steps 2", "--steps must exceed the 2 warm-up steps"),
    ("latency --timeline-cap 3", "--timeline-cap 3 is not one of --caps"),
    ("latency --shaper tc", "invalid choice"),
    ("latency --model huge", "invalid choice"),
    ("latency --rate-mbit -1", "argument --rate-mbit: expected a finite number >= 0"),
    ("latency --cpus 0", "argument --cpus: expected a finite number > 0"),
    ("latency --rounds 0", "argument --rounds: expected an integer >= 1"),
    ("latency --nodes 1", "argument --nodes: expected an integer >= 2"),
    ("latency --run-timeout 0", "argument --run-timeout: expected a finite number > 0"),
    ("latency --collective-timeout 300", "--collective-timeout 300 must be below --run-timeout"),
    ("latency --run-timeout 30", "lower --collective-timeout or raise --run-timeout"),
    ("latency --loss-pct 70", "--loss-pct must be a percentage in [0, 50)"),
    ("latency --jitter-ms -1", "--jitter-ms: expected a finite number >= 0"),
    ("latency --jitter-distribution pareto", "invalid choice: 'pareto'"),
    ("latency --node-ms 2", "--node-ms: expected NODE:MS"),
    ("latency --node-ms 9:1", "--node-ms names nodes [9]"),
    ("latency --node-ms 1:1 --node-ms 1:2", "--node-ms names nodes [1, 1]"),
    # lab memory
    ("memory --nodes 1", "argument --nodes: expected an integer >= 2"),
    ("memory --nodes 3", "--batch-size 64 is not divisible by the world size 3"),
    ("memory --limit-mb 0", "argument --limit-mb: expected a finite number > 0"),
    ("memory --no-limit --limit-mb 500", "--limit-mb sets the limit of the runs --no-limit"),
    ("memory --steps 1", "--steps must exceed the 1 warm-up"),
    # lab straggler
    ("straggler --slowdown 0.5", "--slowdown: expected a finite number >= 1, got '0.5'"),
    ("straggler --cpus 0", "--cpus: expected a finite number > 0"),
    ("straggler --rank -1", "--rank: expected an integer >= 0"),
    ("straggler --rank 7", "--rank must be in 0..3"),
    ("straggler --slow-link-ms -3", "--slow-link-ms: expected a finite number >= 0"),
    ("straggler --loss-pct 1", "give --slow-link-ms too"),
    # lab compress
    ("compress --rate-mbit 20,fast", "--rate-mbit: expected comma-separated numbers"),
    ("compress --comm-hooks fp16", "--comm-hooks must include none"),
    ("compress --rounds 0", "--rounds: expected an integer >= 1"),
]


@pytest.mark.parametrize(("line", "message"), _REFUSED, ids=[line for line, _ in _REFUSED])
def test_bad_arguments_are_refused_before_any_docker_call(line, message, capsys):
    argv = line.split()
    err = cli_error(argv, capsys)
    assert message in err
    assert f"usage: python -m lab {argv[0]}" in err  # the subcommand's usage, not the top's
    assert "Traceback" not in err
