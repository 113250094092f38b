"""The communication hooks' names and PowerSGD's constants, torch-free.

The library registers hooks by these names (:mod:`ddp.wrapper.comm_hooks`) and the training
program offers them as ``--comm-hook`` choices (:mod:`ddp.program.config`); both import them
from here so that the configuration never has to import torch, and the library never the
program.
"""

from __future__ import annotations

__all__ = ["COMM_HOOKS", "POWERSGD_RANK", "POWERSGD_START_ITER"]

COMM_HOOKS = ("none", "fp16", "bf16", "powersgd")
# PowerSGD runs a plain allreduce for its first iterations (torch's start_powerSGD_iter) and
# compresses from step POWERSGD_START_ITER + 1 on; measurements of it must skip those steps.
POWERSGD_START_ITER = 2
POWERSGD_RANK = 1  # its matrix_approximation_rank: each compressed n x m gradient sends n + m
