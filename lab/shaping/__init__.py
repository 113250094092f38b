"""Network shaping for the lab: added latency (netem, or an NFQUEUE userspace delayer), per node
if asked (an asymmetric link), jitter and random loss (:mod:`~lab.shaping.impair`), a rate
limit (tbf), each verified by the probe (TCP and UDP echoes, a bulk transfer) before anything
is measured.

The pieces, one idea each: :mod:`~lab.shaping.base` (the ``Shaper`` interface and the node it
works on), :mod:`~lab.shaping.netem` and :mod:`~lab.shaping.nfqueue` (the two shapers),
:mod:`~lab.shaping.registry` (by name, and ``auto``), :mod:`~lab.shaping.probe` (the link
check) and :mod:`~lab.shaping.link` (``shaped(...)``: choose, apply, verify, undo). What runs
inside the nodes (the delayer, the probe) is standard-library code in :mod:`lab.node`.
"""
