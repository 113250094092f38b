"""Live recovery: survivors of a lost rank keep training in a new group within a fraction of a
second, and a rank that (re)joins heals from a healthy peer, with no restart and no checkpoint.

* ``api``: the public side, a ``Manager`` and an optimizer wrapper that any training loop (its
  own model, data and wrapper, ours or torch's DDP) uses in about ten lines;
  ``examples/recovery_loop.py`` is one such loop.
* ``protocol``: the coordinator, the quorum, the member, liveness, succession, the group per
  quorum, healing and the records: the protocol itself, free of any training program.
* ``drivers``: ``python -m ddp --recovery live`` and ``--recovery torchft``, clients of ``api``.
* ``launch``: any script on the API as a local live job with a fault injected; ``bench``: the
  per-step cost without faults against the restart path.
"""
