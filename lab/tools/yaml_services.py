"""One service block of a generated compose or stack file, rendered from its parts.

compose.yaml (:mod:`lab.tools.compose`, :mod:`lab.tools.torchrun_yaml`) and the swarm stack
(:mod:`lab.tools.stack`) write their services with :func:`service`: the image line, the
``lab.run`` label (what ``python -m lab down`` finds left-overs by), the ``shared`` volume,
networks, dependencies, environment and entrypoint always stand in the same order and form,
so each generator names only what is its own.

A field's value is YAML text: its first line stands after ``key:`` (an anchor, a flow value, or
nothing), the lines after it under the key, two deeper; a list of lines is a value whose lines
all stand under the key. :func:`words` and :func:`shell` write entrypoint lists.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

__all__ = ["AFTER_INIT", "IMAGE", "service", "shell", "words"]

IMAGE = "${LAB_IMAGE:-ddp-lab:latest}"
# Every service that touches the shared volume waits for `init` to have laid it out.
AFTER_INIT = {"init": "service_completed_successfully"}
NOTE_COLUMN = 40  # where a note trailing a line starts


def words(*items: str) -> str:
    """A block list, one item a line; an item of several lines continues under its ``-``."""
    return "".join("\n- " + item.replace("\n", "\n  ") for item in items)


def shell(script: str | Sequence[str]) -> str:
    """``sh -c`` with ``script``: one line as it is, or lines folded into one (``>-``)."""
    if not isinstance(script, str):
        script = ">-\n" + "\n".join(script)
    return words("sh", "-c", script)


def _field(key: str, value: str | Sequence[str]) -> list[str]:
    if not isinstance(value, str):
        value = "".join("\n" + line for line in value)
    first, *rest = value.split("\n")
    return [f"{key}: {first}" if first else f"{key}:", *("  " + line for line in rest)]


def _noted(line: str, notes: Mapping[str, str]) -> list[str]:
    key, _, value = line.strip().partition(":")
    if key not in notes:
        return [line]
    if value:
        return [f"{line:<{NOTE_COLUMN - 1}} # {notes[key]}"]
    return [f"{line[: len(line) - len(line.lstrip())]}# {notes[key]}", line]


def service(
    key: str,
    run: str,
    *,
    entrypoint: str,
    profiles: Sequence[str] = (),
    shared: bool = True,
    networks: Sequence[str] = (),
    depends_on: Mapping[str, str] | None = None,
    environment: str | Sequence[str] = "",
    deploy: str | Sequence[str] = "",
    anchor: str = "",
    notes: Mapping[str, str] | None = None,
    indent: int = 2,
) -> str:
    """The block ``key:`` (``indent`` deep) of a service of :data:`IMAGE` labelled
    ``lab.run: run``.

    ``depends_on`` maps each dependency to its condition; ``shared`` mounts the ``shared``
    volume at /shared. ``notes`` are comments on lines this writes, by key: one trailing a
    ``key: value`` line, or a line of its own above a ``key:`` that has its value below.
    """
    fields = []
    if profiles:
        fields += _field("profiles", f"[{', '.join(profiles)}]")
    fields += _field("image", IMAGE) + _field("labels", f"\nlab.run: {run}")
    if shared:
        fields += _field("volumes", words("shared:/shared"))
    if networks:
        fields += _field("networks", words(*networks))
    if depends_on:
        after = "".join(f"\n{name}:\n  condition: {why}" for name, why in depends_on.items())
        fields += _field("depends_on", after)
    if environment:
        fields += _field("environment", environment)
    fields += _field("entrypoint", entrypoint)
    if deploy:
        fields += _field("deploy", deploy)
    lines = [" " * indent + line for line in _field(key, anchor) + ["  " + f for f in fields]]
    return "\n".join(noted for line in lines for noted in _noted(line, notes or {}))
