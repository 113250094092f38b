"""Bytes per step, derived from the buckets a run reported (``ConfigRecord.bucket_shapes``) and
what each comm hook hands to the allreduce. Pure.

Per rank and step, the *payload* is what the collectives are given:

* ``none``: each bucket's float32 gradients plus one float32 count per parameter (ddp's
  unused-parameter counts ride in the bucket's tail: :mod:`ddp.wrapper.reducer`);
* ``fp16``/``bf16``: the gradients as 2-byte floats (with a hook the counts live apart and are
  only reduced with ``find_unused_parameters``, which the deep MLP does not use);
* ``powersgd`` (rank r, torch's ``powerSGD_hook``): a gradient viewed as an n x m matrix
  (n = its first dimension) is compressed when ``(n + m) r x 2 < n m`` (torch's
  ``min_compression_rate`` 2) and then sends P (n x r) and Q (m x r) in float32; the rest
  (biases) go uncompressed in float32. Three allreduces per bucket instead of one.

On the wire, a ring allreduce (gloo's algorithm for these sizes: reduce-scatter, then
all-gather) makes every rank send ``2 (N - 1) / N`` times the payload. That factor is the
algorithm's, not a measurement; the run also reports what each node's interface really sent.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from ddp.torchfree import POWERSGD_RANK, POWERSGD_START_ITER

__all__ = ["MIN_COMPRESSION_RATE", "job_payload_bytes", "payload_bytes", "ring_factor"]

MIN_COMPRESSION_RATE = 2  # torch's PowerSGDState default
Shapes = Sequence[Sequence[Sequence[int]]]  # per bucket, per parameter, its shape


def _numel(shape: Sequence[int]) -> int:
    return math.prod(shape) if shape else 1


def _powersgd_elements(shape: Sequence[int], rank: int) -> int:
    n = shape[0] if shape else 1
    m = _numel(shape) // n if n else 0
    r = min(n, m, rank)
    if (n + m) * r * MIN_COMPRESSION_RATE < n * m:
        return (n + m) * r  # P and Q
    return n * m  # sent as it is


def payload_bytes(hook: str, shapes: Shapes, rank: int = POWERSGD_RANK) -> int:
    """Bytes one rank hands to the allreduces of one (compressed) step. ``"plain"``: a hook's
    uncompressed allreduce (powersgd's first steps): float32 gradients, no counts."""
    total = 0
    for bucket in shapes:
        numel = sum(_numel(s) for s in bucket)
        if hook == "none":
            total += 4 * (numel + len(bucket))
        elif hook == "plain":
            total += 4 * numel
        elif hook in ("fp16", "bf16"):
            total += 2 * numel
        elif hook == "powersgd":
            total += 4 * sum(_powersgd_elements(s, rank) for s in bucket)
        else:
            raise ValueError(f"no byte count for comm hook {hook!r}")
    return total


def job_payload_bytes(hook: str, shapes: Shapes, steps: int) -> int:
    """Bytes one rank hands to the gradient allreduces over a whole job of ``steps`` steps:
    powersgd's first ``POWERSGD_START_ITER`` steps are plain allreduces."""
    if hook != "powersgd":
        return steps * payload_bytes(hook, shapes)
    plain = min(steps, POWERSGD_START_ITER)
    return plain * payload_bytes("plain", shapes) + (steps - plain) * payload_bytes(hook, shapes)


def ring_factor(world_size: int) -> float:
    """What each rank sends per payload byte in a ring allreduce: ``2 (N - 1) / N``."""
    if world_size < 1:
        raise ValueError(f"world size must be >= 1, got {world_size}")
    return 2 * (world_size - 1) / world_size
