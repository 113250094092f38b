"""Network shaping for the lab: added latency (netem or an NFQUEUE userspace delayer), a rate
limit (tbf), and a TCP echo probe that checks the shaping took effect before anything is measured.

Submodules are imported explicitly (``from lab.shaping import netem, nfqueue, probe``); this file
imports none of them so that ``python -m lab.shaping.nfqueue`` / ``.probe`` run without a
double-import warning. ``nfqueue`` and ``probe`` use only the standard library, so they also run
inside a node container as plain files.
"""
