"""The live-recovery protocol, the small version of torchft's on plain gloo. It knows nothing of
any training program (``ddp.recovery.api`` is its public side) nor of what carries it: the
control plane is etcd (``ddp.recovery.etcd``: leases, the decider role, ``EtcdStore``).

* ``quorum``: the decider's decision (which ranks train the next step), pure; ``messages``: the
  quorum and the notice that ends one, as values, and the job's secret.
* ``member``: what a rank knows of its quorum (``MemberState``) and how the end of one wakes
  every thread that waits on it.
* ``waiting``: collectives waited on in a way a peer's abort or a timeout can interrupt;
  ``group``: a fresh gloo group per quorum, on a store of its own.
* ``heal``: the state of a healthy member, as tensors and JSON, to each member that is behind,
  and the digest that says who is.
"""
