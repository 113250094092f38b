"""Network shaping for the lab: added latency (netem, or an NFQUEUE userspace delayer), a rate
limit (tbf), verified by a TCP echo probe before anything is measured.

The pieces, one idea each: :mod:`~lab.shaping.base` (the ``Shaper`` interface and the node it
works on), :mod:`~lab.shaping.netem` and :mod:`~lab.shaping.nfqueue` (the two shapers),
:mod:`~lab.shaping.registry` (by name, and ``auto``), :mod:`~lab.shaping.probe` (the link
check) and :mod:`~lab.shaping.link` (``shaped(...)``: choose, apply, verify, undo). What runs
inside the nodes (the delayer, the probe) is standard-library code in :mod:`lab.node`.
"""
