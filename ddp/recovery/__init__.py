"""Live recovery: survivors of a lost rank keep training in a new group within a fraction of a
second, and a rank that (re)joins heals from a healthy peer, with no restart and no checkpoint.

* ``api``: the public side, a ``Manager`` and an optimizer wrapper that any training loop (its
  own model, data and wrapper, ours or torch's DDP) uses in about ten lines;
  ``examples/recovery_loop.py`` is one such loop.
* ``protocol``: the quorum, a member's state, waits that a peer's abort interrupts, the group
  per quorum and healing: the protocol itself, free of any training program and of etcd;
  ``records``: the typed record of every event; ``failpoints``: the named moments at which a
  test makes a process die.
* ``etcd``: the control plane of live jobs: a client of etcd's JSON gateway, a job's own
  three-member cluster with mutual TLS, a torch ``Store`` over it (gloo's rendezvous), the
  job's sealed keys, the decider role held by a lease and a rank's side (``EtcdMember``).
  The lab runs the same members in containers of their own (``lab.engine.etcd``).
* ``demo``: ``python -m ddp --recovery live`` and ``--recovery torchft``, clients of ``api``.
* ``harness``: what runs and judges live jobs on this host: ``local`` and ``launch`` (the job's
  processes, with a fault injected), ``campaign`` and ``audit`` (many faults, and the judge of
  each trial), ``endurance``, ``bench`` (the per-step cost against the restart path).
"""
