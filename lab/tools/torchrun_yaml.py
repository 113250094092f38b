"""The torchrun worker of generated files: compose.yaml's ``torchrun`` profile and the swarm
stack (:mod:`lab.tools.stack`) run the same command, built here from
:func:`lab.engine.training.torchrun_head` (torchrun's flags) and compose.py's ddp flags.

Workers are interchangeable replicas (``--scale worker=N``, swarm ``replicas: N``): none has a
name the others could rendezvous at, so a ``rdzv`` service holds the c10d store
(:mod:`lab.node.store`) and every agent is its client (``is_host=false``). Each agent gives its
own address (``hostname -i``) as ``--local-addr``: torchrun's default, the FQDN, is a container
id the other containers may not resolve. ddp runs with ``--auto-resume``, so a worker group
that torchrun restarts (``MAX_RESTARTS``) continues from the newest checkpoint
(``CHECKPOINT_EVERY``) on the shared volume; each worker writes torchrun's exit code to
``/shared/exits/<hostname>``, which the store waits for.
"""

from __future__ import annotations

from lab.engine.training import RDZV_PORT, TORCHRUN_ENV, torchrun_head
from lab.tools.yaml_services import AFTER_INIT, service, shell, words

__all__ = ["ENV", "compose_services", "settings", "store_entrypoint", "worker_command"]

# Variables of the torchrun worker (name, default, what), listed in the files' headers.
ENV = (
    ("NNODES", "4", "torchrun --nnodes: the number of workers (= --scale worker=N)"),
    ("NPROC_PER_NODE", "1", "torchrun --nproc-per-node: ranks per worker"),
    ("MAX_RESTARTS", "0", "torchrun --max-restarts: restarts of the worker group"),
    ("CHECKPOINT_EVERY", "0", "ddp --checkpoint-every: what a restart resumes from"),
    ("JOIN_TIMEOUT", "120", "seconds the c10d rendezvous waits for every worker"),
)


def _var(name: str) -> str:
    default = next(d for n, d, _ in ENV if n == name)
    return f'"${{{name}:-{default}}}"'


def settings() -> str:
    """The header's comment lines on :data:`ENV`: variable, default, what it sets."""
    return "\n".join(f"#   {name:<20} {default:<6} {what}" for name, default, what in ENV)


def worker_command(ddp_flags: list[str], rdzv_id: str, *, shared: bool = True) -> list[str]:
    """The ``sh -c`` script of one worker, as the lines of a folded YAML scalar. ``shared``:
    the exit code goes to a file on the shared volume; else to the ``rdzv`` store over TCP,
    and the world is elastic (a stack across hosts, which share no volume and may lose one)."""
    # The stack is elastic, --nnodes MIN:MAX: the container's shell expands NNODES_MIN, unset
    # meaning NNODES (a fixed world), as docker stack deploy knows no nested ${A:-${B}}.
    n = _var("NNODES")[1:-1]
    nnodes = _var("NNODES") if shared else f'"$${{NNODES_MIN:-{n}}}:{n}"'
    head = torchrun_head(
        nnodes,
        _var("NPROC_PER_NODE"),
        f"rdzv:{RDZV_PORT}",
        rdzv_id,
        _var("MAX_RESTARTS"),
        "is_host=false,join_timeout=${JOIN_TIMEOUT:-120}",
        '"$$(hostname -i)"',
    )
    lines = [
        " ".join(head[:5]),
        " ".join(head[5:11]),
        " ".join(head[11:13]),
        " ".join(head[13:]),
        "-m ddp train --log-dir /shared/logs --auto-resume",
        f"--checkpoint-every {_var('CHECKPOINT_EVERY')}",
        *ddp_flags,
    ]
    lines[-1] += ";"
    if shared:
        lines.append("code=$$?; echo $$code > /shared/exits/$$(hostname); exit $$code")
    else:
        lines.append(
            f"code=$$?; python -m lab.node.store --report rdzv:{RDZV_PORT} "
            '--name "$$(hostname)" --code "$$code"; exit $$code'
        )
    return lines


def store_entrypoint(*, shared: bool = True) -> str:
    """The ``rdzv`` service's entrypoint: the c10d store, until every worker's exit code (in
    files on the shared volume, or with ``shared`` False reported to the store itself; then
    ``NNODES_MIN`` reports are enough once the rest are a minute late: lost with their host)."""
    return words(
        "python",
        "-m",
        "lab.node.store",
        f"--port={RDZV_PORT}",
        *(["--dir=/shared/exits"] if shared else ["--min=${NNODES_MIN:-}"]),
        "--count=${NNODES:-4}",
        "--timeout=${RUN_TIMEOUT:-900}",
    )


def compose_services(ddp_flags: list[str]) -> str:
    """compose.yaml's ``torchrun`` profile: ``rdzv``, ``worker`` and the closing ``torchrun``."""
    env = ", ".join(f"{k}: {v!r}" for k, v in TORCHRUN_ENV.items())
    rdzv = service(
        "rdzv",
        "compose",
        profiles=["torchrun"],
        depends_on=AFTER_INIT,
        entrypoint=store_entrypoint(),
    )
    worker = service(
        "worker",
        "compose",
        profiles=["torchrun"],
        depends_on={**AFTER_INIT, "rdzv": "service_started"},
        environment=f"{{<<: *env, {env}}}",
        entrypoint=shell(worker_command(ddp_flags, "compose")),
    )
    closing = service(
        "torchrun",
        "compose",
        profiles=["torchrun"],
        shared=False,
        depends_on={"worker": "service_started", "rdzv": "service_completed_successfully"},
        entrypoint='["true"]',
    )
    return f"""\
  # --- profile torchrun: one torchrun per worker container, ranks from the c10d rendezvous
  #   NNODES=2 NPROC_PER_NODE=2 docker compose --profile torchrun up --scale worker=2 \\
  #     --attach-dependencies torchrun
{rdzv}
{worker}
{closing}
"""
