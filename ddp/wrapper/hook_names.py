"""The communication hooks' names and PowerSGD's constants, torch-free.

The library registers hooks by these names (:mod:`ddp.wrapper.comm_hooks`) and the training
program offers them as ``--comm-hook`` choices (:mod:`ddp.program.config`); both import them
from here so that the configuration never has to import torch, and the library never the
program.
"""

from __future__ import annotations

__all__ = [
    "COMMS",
    "COMM_HOOKS",
    "COMPRESSION_HOOKS",
    "EXACT_HOOKS",
    "POWERSGD_RANK",
    "POWERSGD_START_ITER",
    "TOPOLOGY_HOOKS",
]

# torch's hooks: the same allreduce, fewer bytes (``lab compress`` sweeps these)
COMPRESSION_HOOKS = ("none", "fp16", "bf16", "powersgd")
# the two-level allreduce (ddp.wrapper.hierarchical): within each node, across, within again
TOPOLOGY_HOOKS = ("hierarchical", "hierarchical-fp16")
COMM_HOOKS = COMPRESSION_HOOKS + TOPOLOGY_HOOKS
# hooks whose average is exact up to the order of float sums: parity is judged, not priced
EXACT_HOOKS = ("none", "hierarchical")
# --comm: default = the built-in allreduce (or --comm-hook's); auto = the cap and an exact
# algorithm chosen from measurements, and chosen again when the link changes (comm_auto)
COMMS = ("default", "auto")
# PowerSGD runs a plain allreduce for its first iterations (torch's start_powerSGD_iter) and
# compresses from step POWERSGD_START_ITER + 1 on; measurements of it must skip those steps.
POWERSGD_START_ITER = 2
POWERSGD_RANK = 1  # its matrix_approximation_rank: each compressed n x m gradient sends n + m
