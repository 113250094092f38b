"""Live recovery: survivors of a lost rank keep training in a new group within a fraction of a
second, and a rank that (re)joins heals from a healthy peer, with no restart and no checkpoint.

The small version of torchft's protocol, on plain gloo and one ``TCPStore``:

* ``coordinator``: a process of its own that holds the store and decides every quorum (which
  ranks train the next step) from registrations, heartbeats and abort notices.
* ``quorum``: that decision, pure: the fast path, a change, a refused split.
* ``member``: a rank's side: registration, heartbeats, the watcher that learns of an abort at
  once, waiting for the next quorum.
* ``waiting``: collectives waited on in a way a peer's abort or a timeout can interrupt.
* ``group``: a fresh gloo group per quorum under the store prefix of its id.
* ``heal``: weights, optimizer state and step number from a healthy member to one behind.
* ``live``: the training loop with its commit vote; ``local``: ``python -m ddp --recovery
  live`` (ranks as processes, a fault injected, the timeline printed).
"""
