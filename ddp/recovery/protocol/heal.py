"""Healing: a member that is behind receives a healthy member's whole state over the new group,
not from disk: whatever the loop's ``state_dict`` callable returns (model, optimizer, its own
position in the data, an LR scheduler), and the step number.

Tensors and JSON only, never pickle (a peer's bytes are data, not code): ``flatten`` splits a
nested state into a JSON skeleton, in which every tensor is replaced by its dtype and shape, and
the list of its tensors. The source sends one header (two int64: the skeleton's length and the
tensors' bytes) and one uint8 buffer (the skeleton's UTF-8, then every tensor's bytes in order);
the receiver allocates what the header says, receives into it, rebuilds the state
(``unflatten``) and hands it to ``load_state_dict``.

Right after a quorum's group is built, every member all-gathers ``[step, digest]``, the digest
being sha256 over every tensor's dtype, shape and bytes in order (``state_digest``: parameters,
buffers, optimizer state, any tensor of the loop's own state, whatever the callable returns).
Values that are not tensors (counters, a loop's bookkeeping) travel with a heal but do not
decide who is behind: the step number does. The source holds the digest of the majority of
the members at the highest step (``heal_source``: the lowest group rank among them); a member
with another digest is never a source, and with no majority digest nobody heals (a split: the
run stops rather than pick a lineage). A member is behind when its step is lower (a replacement
starts at 0; a member whose commit vote failed while the others' passed is one step back) or
when its digest differs from the source's at the same step.

The receiver treats the source's bytes as untrusted: the header's lengths are bounded before
anything is allocated, and every tensor the skeleton names must have a real dtype, a shape of
non-negative sizes and bytes that tile the payload exactly (``_unpack``), as ``decode_state`` of
``ddp.wrapper.wire`` does. The same exchange tells the members
at the top step whether they were identical after the last committed step, which a check that
failed mid-gather could not say.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from ddp.recovery.failpoints import failpoint
from ddp.recovery.protocol.member import MemberState
from ddp.recovery.protocol.waiting import wait_work

__all__ = ["Heal", "HealRefused", "flatten", "heal", "heal_source", "state_digest", "unflatten"]

# The most bytes a heal header may announce (skeleton + tensors): beyond it the receiver refuses
# before allocating. 64 GiB: far above any state this host trains, far below what a forged
# header could ask for (2**63).
MAX_HEAL_BYTES = 1 << 36

# JSON has no tuples, no non-string keys and no tensors: each gets a one-key object of its own,
# and every dict is written as its list of pairs, so no user key can be mistaken for a tag.
_DICT, _TUPLE, _TENSOR = "$dict", "$tuple", "$tensor"


class HealRefused(ValueError):
    """The exchange cannot heal safely: no majority digest, or the source's bytes are not a
    state this receiver can rebuild. One line: what was wrong."""


def heal_source(rows: list[tuple[int, bytes]]) -> int:
    """The group rank to heal from, given every member's ``(step, digest)``: the lowest rank
    holding the digest that more than half of the members at the top step hold. A member at
    the top step with another digest is never a source (today's lowest-rank rule would have
    spread its weights to everyone); with no such majority, ``HealRefused``."""
    if not rows:
        raise HealRefused("the heal exchange has no members")
    top = max(step for step, _ in rows)
    at_top = [(g, d) for g, (step, d) in enumerate(rows) if step == top]
    counts: dict[bytes, int] = {}
    for _, d in at_top:
        counts[d] = counts.get(d, 0) + 1
    digest, n = max(counts.items(), key=lambda kv: kv[1])
    if 2 * n <= len(at_top):
        raise HealRefused(
            f"no majority digest at step {top}: {len(counts)} digests among {len(at_top)} "
            "members, refusing to pick a lineage (split brain); restart from a checkpoint"
        )
    return min(g for g, d in at_top if d == digest)


@dataclass(frozen=True)
class Heal:
    """What the exchange found. ``source``: group rank of the healer; ``healed``: the group
    ranks that received its state; ``seconds`` and ``nbytes``: this rank's transfer (0 when it
    took no part)."""

    source: int
    healed: tuple[int, ...]
    step: int
    identical: bool  # the members already at ``step`` agreed bitwise before any transfer
    nbytes: int = 0
    seconds: float = 0.0


def flatten(state: Any) -> tuple[str, list[torch.Tensor]]:
    """``state`` as a JSON skeleton and its tensors, in the order the skeleton names them;
    TypeError for anything that is neither a tensor, a container of them nor JSON."""
    tensors: list[torch.Tensor] = []

    def encode(v: Any, where: str) -> Any:
        if isinstance(v, torch.Tensor):
            tensors.append(v.detach())
            return {_TENSOR: [len(tensors) - 1, str(v.dtype).removeprefix("torch."), [*v.shape]]}
        if isinstance(v, dict):
            for k in v:
                if not isinstance(k, (str, int, float, bool)) and k is not None:
                    raise TypeError(f"state key {k!r} at {where}: only str, int, float keys")
            return {_DICT: [[k, encode(x, f"{where}.{k}")] for k, x in v.items()]}
        if isinstance(v, tuple):
            return {_TUPLE: [encode(x, f"{where}[{i}]") for i, x in enumerate(v)]}
        if isinstance(v, list):
            return [encode(x, f"{where}[{i}]") for i, x in enumerate(v)]
        if v is None or isinstance(v, (str, int, float, bool)):
            return v
        raise TypeError(
            f"state value at {where} is a {type(v).__name__}: healing sends tensors and JSON "
            "only (no pickle); return its state_dict(), or plain numbers and strings"
        )

    return json.dumps(encode(state, "state")), tensors


def unflatten(skeleton: str, tensors: list[torch.Tensor]) -> Any:
    """The state ``flatten`` split, from its skeleton and tensors."""

    def decode(v: Any) -> Any:
        if isinstance(v, list):
            return [decode(x) for x in v]
        if isinstance(v, dict):
            if _DICT in v:
                return {k: decode(x) for k, x in v[_DICT]}
            if _TUPLE in v:
                return tuple(decode(x) for x in v[_TUPLE])
            return tensors[v[_TENSOR][0]]
        return v

    return decode(json.loads(skeleton))


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A tensor's bytes, as a flat uint8 view (a copy only if it is not contiguous)."""
    return t.contiguous().reshape(-1).view(torch.uint8)


def state_digest(tensors: list[torch.Tensor]) -> bytes:
    """sha256 over every tensor's dtype, shape and bytes, in order: two states one bit apart in
    any tensor differ (a sum would not tell every such pair apart)."""
    h = hashlib.sha256()
    for t in tensors:
        h.update(f"{t.dtype}{[*t.shape]};".encode())
        h.update(_bytes(t).numpy())
    return h.digest()


def _row(step: int, digest: bytes) -> torch.Tensor:
    words = [int.from_bytes(digest[i : i + 8], "little", signed=True) for i in range(0, 32, 8)]
    return torch.tensor([step, *words], dtype=torch.int64)


def _pack(skeleton: str, tensors: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
    head = skeleton.encode()
    parts = [torch.frombuffer(bytearray(head), dtype=torch.uint8), *map(_bytes, tensors)]
    payload = torch.cat(parts) if parts else torch.empty(0, dtype=torch.uint8)
    return torch.tensor([len(head), payload.numel() - len(head)], dtype=torch.int64), payload


def _header_sizes(header: torch.Tensor, limit: int = MAX_HEAL_BYTES) -> tuple[int, int]:
    """(skeleton bytes, tensor bytes) of a received header, refused before any allocation when
    negative or above ``limit`` together."""
    n, rest = int(header[0]), int(header[1])
    if n < 0 or rest < 0 or n + rest > limit:
        raise HealRefused(
            f"heal header announces {n} + {rest} bytes: each must be >= 0 and together "
            f"<= {limit}; the source is not a member of this job or is broken"
        )
    return n, rest


def _spec(v: Any, count: int) -> tuple[int, torch.dtype, list[int]]:
    if not (isinstance(v, list) and len(v) == 3):
        raise HealRefused(f"heal skeleton names a tensor as {v!r}, not [index, dtype, shape]")
    i, name, shape = v
    found = getattr(torch, name, None) if isinstance(name, str) else None
    if not isinstance(found, torch.dtype):
        raise HealRefused(f"heal skeleton names {name!r}, not a torch dtype")
    if not (isinstance(i, int) and 0 <= i < count) or isinstance(i, bool):
        raise HealRefused(f"heal skeleton names tensor index {i!r} of {count}")
    ok = isinstance(shape, list) and all(isinstance(d, int) and d >= 0 for d in shape)
    if not ok:
        raise HealRefused(f"heal skeleton names shape {shape!r}: a list of sizes >= 0 wanted")
    return i, found, shape


def _unpack(header: torch.Tensor, payload: torch.Tensor) -> Any:
    n, rest = _header_sizes(header)
    if payload.numel() != n + rest:
        raise HealRefused(f"heal payload is {payload.numel()} bytes, its header said {n + rest}")
    try:
        skeleton = bytes(payload[:n].numpy()).decode()
        tree = json.loads(skeleton)
    except (UnicodeDecodeError, ValueError) as e:
        raise HealRefused(f"heal skeleton is not UTF-8 JSON: {e}") from None
    raw: list[Any] = []

    def collect(v: Any) -> None:
        if isinstance(v, list):
            for x in v:
                collect(x)
        elif isinstance(v, dict):
            if _TENSOR in v:
                raw.append(v[_TENSOR])
            for x in v.get(_DICT, v.get(_TUPLE, [])):
                collect(x)

    collect(tree)
    specs = [_spec(v, len(raw)) for v in raw]
    if sorted(i for i, _, _ in specs) != list(range(len(specs))):
        raise HealRefused("heal skeleton names a tensor index twice")
    # Sizes are checked against the bytes sent before a single tensor is allocated.
    sizes = {}
    for i, dtype, shape in specs:
        numel = 1
        for d in shape:
            numel *= d
        sizes[i] = numel * torch.empty(0, dtype=dtype).element_size()
    if sum(sizes.values()) != rest:
        raise HealRefused(
            f"heal skeleton names {sum(sizes.values())} tensor bytes, the header {rest}"
        )
    tensors, offset = [None] * len(specs), n
    for i, dtype, shape in sorted(specs, key=lambda s: s[0]):
        t = torch.empty(shape, dtype=dtype)
        t.reshape(-1).view(torch.uint8).copy_(payload[offset : offset + sizes[i]])
        tensors[i], offset = t, offset + sizes[i]
    try:
        return unflatten(skeleton, tensors)
    except (KeyError, TypeError, ValueError, IndexError) as e:
        raise HealRefused(f"heal skeleton does not rebuild: {e!r}") from None


@torch.no_grad()
def heal(
    member: MemberState,
    pg: dist.ProcessGroup,
    tag: int,
    step: int,
    state_dict: Callable[[], Any],
    load_state_dict: Callable[[Any], None],
    timeout_s: float,
) -> Heal:
    """Run the exchange on every member of the new group (``tag``: the quorum id, which pairs
    the sends with their receives). A member that is behind has loaded the source's state when
    it returns; ``Heal.step`` is every member's step from now on."""
    me, world = pg.rank(), pg.size()
    skeleton, tensors = flatten(state_dict())
    mine = _row(step, state_digest(tensors))
    everyone = [torch.empty_like(mine) for _ in range(world)]
    wait_work(pg.allgather([everyone], [mine]), member, timeout_s, "the heal exchange")
    table = torch.stack(everyone)
    top = int(table[:, 0].max())
    src = heal_source([(int(r[0]), r[1:].numpy().tobytes()) for r in table])
    same = (table[:, 1:] == table[src, 1:]).all(dim=1)
    at_top = table[:, 0] == top
    identical = bool(same[at_top].all())
    behind = tuple(g for g in range(world) if not (at_top[g] and same[g]))
    if me != src and me not in behind:
        return Heal(src, behind, top, identical)
    t0 = time.perf_counter()
    if me == src:
        if not behind:
            return Heal(src, behind, top, identical)
        header, payload = _pack(skeleton, tensors)
        failpoint("heal.sending", step=top)
        for g in behind:
            what = f"heal send to group rank {g}"
            wait_work(pg.send([header], g, tag), member, timeout_s, what)
            wait_work(pg.send([payload], g, tag), member, timeout_s, what)
    else:
        header = torch.empty(2, dtype=torch.int64)
        failpoint("heal.receiving", step=top)
        wait_work(pg.recv([header], src, tag), member, timeout_s, "heal receive")
        payload = torch.empty(sum(_header_sizes(header)), dtype=torch.uint8)
        wait_work(pg.recv([payload], src, tag), member, timeout_s, "heal receive")
        load_state_dict(_unpack(header, payload))
    return Heal(src, behind, top, identical, payload.numel(), time.perf_counter() - t0)
