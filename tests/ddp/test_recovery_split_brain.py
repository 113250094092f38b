"""Split brain and a forged heal, pure: the heal source is the majority digest at the top
step (a member with another digest is never a source; no majority, no heal), and the heal
receiver refuses a header or skeleton it cannot trust before allocating what it names."""

from __future__ import annotations

import json
import socket
import time

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from ddp.recovery.protocol.heal import (
    MAX_HEAL_BYTES,
    HealRefused,
    _header_sizes,
    _pack,
    _unpack,
    flatten,
    heal_source,
)

A, B, C = b"a" * 32, b"b" * 32, b"c" * 32


def test_the_source_holds_the_majority_digest_at_the_top_step():
    # Rank 0 is at the top step with a digest the others there do not hold: the old rule
    # (lowest rank at the top step) healed everyone to it.
    assert heal_source([(7, B), (7, A), (7, A), (0, C)]) == 1
    assert heal_source([(0, C), (7, A), (6, B), (7, A)]) == 1
    assert heal_source([(3, A)]) == 0
    # A replacement at step 0 counts for nothing at the top step.
    assert heal_source([(0, C), (0, C), (5, A)]) == 2


@pytest.mark.parametrize("rows", [[(7, A), (7, B)], [(7, A), (7, B), (7, C)], []])
def test_no_majority_digest_heals_nobody(rows):
    with pytest.raises(HealRefused, match=r"no majority digest|no members"):
        heal_source(rows)


def _packed() -> tuple[torch.Tensor, torch.Tensor]:
    return _pack(*flatten({"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "n": 4}))


@pytest.mark.parametrize("header", [[-1, 0], [0, -5], [MAX_HEAL_BYTES, 1], [2**62, 2**62]])
def test_a_header_out_of_bounds_is_refused_before_allocating(header):
    _, payload = _packed()
    with pytest.raises(HealRefused, match="heal header announces"):
        _unpack(torch.tensor(header, dtype=torch.int64), payload)


def _forged(skeleton: object, tensor_bytes: bytes = b"") -> tuple[torch.Tensor, torch.Tensor]:
    head = json.dumps(skeleton).encode()
    body = bytearray(head + tensor_bytes)
    payload = torch.frombuffer(body, dtype=torch.uint8) if body else torch.empty(0)
    return torch.tensor([len(head), len(tensor_bytes)], dtype=torch.int64), payload


@pytest.mark.parametrize(
    "skeleton, nbytes, words",
    [
        ({"$tensor": [0, "float32", [1 << 40]]}, 4, "names 4398046511104 tensor bytes"),
        ({"$tensor": [0, "float32", [-1]]}, 0, "shape"),
        ({"$tensor": [0, "nonsense", [1]]}, 4, "not a torch dtype"),
        ({"$tensor": [0, "Tensor", [1]]}, 4, "not a torch dtype"),
        ({"$tensor": [3, "float32", [1]]}, 4, "tensor index"),
        ({"$tensor": "x"}, 0, "not \\[index, dtype, shape\\]"),
        ([{"$tensor": [0, "uint8", [1]]}, {"$tensor": [0, "uint8", [1]]}], 2, "index"),
        ({"$tensor": [0, "float32", [2]]}, 4, "names 8 tensor bytes, the header 4"),
    ],
)
def test_a_forged_skeleton_is_refused_in_one_line(skeleton, nbytes, words):
    header, payload = _forged(skeleton, b"\0" * nbytes)
    with pytest.raises(HealRefused, match=words) as e:
        _unpack(header, payload)
    assert "\n" not in str(e.value)


def test_junk_instead_of_a_skeleton_is_refused():
    junk = bytearray(b"\xff\xfe{{not json")
    header = torch.tensor([len(junk), 0], dtype=torch.int64)
    with pytest.raises(HealRefused, match="not UTF-8 JSON"):
        _unpack(header, torch.frombuffer(junk, dtype=torch.uint8))
    header, payload = _packed()
    with pytest.raises(HealRefused, match="header said"):
        _unpack(header, payload[:-1])


def test_an_honest_state_still_unpacks():
    header, payload = _packed()
    back = _unpack(header, payload)
    assert back["n"] == 4 and torch.equal(back["w"], torch.arange(6.0).reshape(2, 3))


def _forging_pair(rank: int, port: int, out: str) -> None:
    """Two real gloo ranks: rank 0 sends a forged heal header (2**62 bytes) the way a source
    does; rank 1 receives it as the heal receiver does and must refuse before allocating."""
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=2)
    try:
        if rank == 0:
            dist.send(torch.tensor([2**62, 2**62], dtype=torch.int64), 1)
        else:
            header = torch.empty(2, dtype=torch.int64)
            dist.recv(header, 0)
            try:
                _header_sizes(header)
                said = "accepted"
            except HealRefused as e:
                said = str(e)
            with open(out, "w") as f:
                f.write(said)
    finally:
        dist.destroy_process_group()


def test_a_real_gloo_receiver_refuses_a_forged_header(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    out = tmp_path / "said"
    ctx = mp.start_processes(_forging_pair, (port, str(out)), nprocs=2, join=False)
    t0 = time.monotonic()
    try:
        while not ctx.join(timeout=1):
            assert time.monotonic() - t0 < 60, "the forged-header pair did not finish in 60 s"
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.kill()
    assert "heal header announces" in out.read_text()
