"""The live-recovery protocol, the small version of torchft's on plain gloo. It knows nothing of
any training program (``ddp.recovery.api`` is its public side). What does not depend on the
control plane (``member.MemberState``, ``quorum``, ``waiting``, ``group``, ``heal``) serves
both: etcd (``ddp.recovery.etcd``, local jobs) and one ``TCPStore`` (the lab's containers):

* ``coordinator``: a process of its own that holds the store and decides every quorum (which
  ranks train the next step) from registrations, heartbeats and abort notices; ``quorum``: that
  decision, pure; ``messages``: the store's keys, the signed quorum, the job's secret.
* ``member``: a rank's side: registration, heartbeats, the watcher that learns of an abort at
  once, waiting for the next quorum; ``liveness``: one idle connection per member whose end is
  the process's death; ``succession``: a member takes over when the coordinator is lost.
* ``waiting``: collectives waited on in a way a peer's abort or a timeout can interrupt;
  ``group``: a fresh gloo group per quorum under the store prefix of its id.
* ``heal``: the state of a healthy member, as tensors and JSON, to each member that is behind,
  and the digest that says who is; ``records``: the typed records of every event.
"""
