"""The Docker lab: starts topologies of CPU containers that each run ``python -m ddp train``
ranks, follows them, collects their logs, and re-checks parity. Entry point: ``python -m lab``.

Submodules import the docker SDK lazily from the CLI, so ``lab.node`` (the in-container
launcher) and ``lab.topology`` stay light.
"""

__all__: list[str] = []
