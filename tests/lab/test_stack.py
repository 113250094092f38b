"""The swarm stack file, pure: dnsrr everywhere, an overlay network, the same worker command as
compose's torchrun profile, and no ${VAR:+...} that docker stack deploy cannot expand."""

import re

import yaml

from lab.tools.compose import render as render_compose
from lab.tools.stack import render


def test_every_service_is_dnsrr_on_an_overlay_and_never_restarted_by_the_swarm():
    stack = yaml.safe_load(render())
    assert stack["networks"]["net"]["driver"] == "overlay"
    for name in ("rdzv", "worker"):
        deploy = stack["services"][name]["deploy"]
        assert deploy["endpoint_mode"] == "dnsrr", name
        assert deploy["restart_policy"] == {"condition": "none"}, name
        assert stack["services"][name]["networks"] == ["net"]
    assert stack["services"]["worker"]["deploy"]["replicas"] == "${NNODES:-4}"
    assert stack["services"]["worker"]["deploy"]["placement"] == {
        "max_replicas_per_node": "${MAX_PER_HOST:-1}"
    }


def test_nothing_is_shared_but_the_network():
    stack = yaml.safe_load(render())
    assert "volumes" not in stack
    for name in ("rdzv", "worker"):
        assert "volumes" not in stack["services"][name], name
    worker = stack["services"]["worker"]["entrypoint"][2]
    assert "/shared/exits" not in worker and "/shared/exits" not in render()
    assert 'lab.node.store --report rdzv:29400 --name "$$(hostname)" --code "$$code"' in worker


def test_switches_are_left_to_the_containers_shell():
    text = render()
    assert not re.search(r"(?<!\$)\$\{[A-Z_]+:\+", text)  # stack deploy would mangle these
    env = yaml.safe_load(text)["services"]["worker"]["environment"]
    assert env["NO_OVERLAP"] == "${NO_OVERLAP:-}" and "$${NO_OVERLAP:+--no-overlap}" in text
    assert env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] == "1"


def test_the_worker_runs_what_compose_runs():
    worker = yaml.safe_load(render())["services"]["worker"]["entrypoint"][2]
    composed = yaml.safe_load(render_compose())["services"]["worker"]["entrypoint"][2]
    assert worker.startswith("torchrun --nnodes")
    assert "--rdzv-endpoint rdzv:29400" in worker and "--auto-resume" in worker
    # the same training; only where the exit code goes differs (the store, not a volume)
    train = worker.split("--rdzv-id stack")[1].split("code=$$?")[0]
    # a switch is `${NAME:+--flag}` in compose and `$${NAME:+--flag}` in the stack (expanded
    # by the worker's shell, not by the stack's interpolation): every switch, whichever it is
    composed_train = composed.split("--rdzv-id compose")[1].split("code=$$?")[0]
    assert train == re.sub(r"(?<!\$)\$\{([A-Z_]+):\+", r"$${\1:+", composed_train)


def test_the_stack_is_elastic_down_to_nnodes_min():
    stack = yaml.safe_load(render())
    worker = stack["services"]["worker"]
    assert worker["entrypoint"][2].startswith(
        'torchrun --nnodes "$${NNODES_MIN:-${NNODES:-4}}:${NNODES:-4}"'
    )
    assert worker["environment"]["NNODES_MIN"] == "${NNODES_MIN:-}"
    store = stack["services"]["rdzv"]["entrypoint"]
    assert "--min=${NNODES_MIN:-}" in store and "--count=${NNODES:-4}" in store
    # compose's workers share one engine: a fixed world there
    composed = yaml.safe_load(render_compose())["services"]["worker"]["entrypoint"][2]
    assert composed.startswith('torchrun --nnodes "${NNODES:-4}" ')
