"""``--recovery torchft``: the same job as ``--recovery live``, driven by torchft's ``Manager``
(pytorch/torchft, pinned 0.2.0, the optional ``[torchft]`` extra) instead of our coordinator.

What stays ours: the model, the data (the global batch kept over any world,
``ddp.recovery.batches``), the optimizer, and the wrapper, ``ddp.wrapper``'s
``DistributedDataParallel``. torchft drives it through the wrapper's comm-hook path, as
``torchft.ddp`` drives torch's: the wrapper is built on a local one-rank group (so its own
collectives, the construction sync and the bucket rebuild, stay on this process) and every
gradient bucket goes to ``Manager.allreduce``, which sends it over torchft's reconfigurable
gloo group of the current quorum. The bucket plan is fixed before the first step (the rebuild
would take each replica's own gradient order, and a healed replica must have its peers' plan).

What is torchft's: the lighthouse (``python -m ddp.recovery.tft.lighthouse``, its Rust server)
forms a quorum per step; each replica is a replica group of one rank with its own store and
manager server; a failed allreduce is swallowed and reported, ``should_commit`` then says no,
and the step is redone in the next quorum; a replica that joins receives the weights, the
momentum and the step from a peer over torchft's HTTP checkpoint transport.

Each replica writes the records of ``ddp.recovery.records`` (quorum, fault, commit, heal,
verdict), so ``ddp.recovery.timeline`` reports a torchft run as it reports ours.
"""

from __future__ import annotations

import importlib.util

__all__ = ["MISSING", "require_torchft"]

MISSING = (
    "--recovery torchft needs torchft, which is not installed: pip install -c constraints.txt "
    "-e '.[torchft]'"
)


def require_torchft() -> None:
    """ValueError (one line: what to install) when torchft cannot be imported."""
    if importlib.util.find_spec("torchft") is None:
        raise ValueError(MISSING)
