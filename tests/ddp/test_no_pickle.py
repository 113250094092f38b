"""Nothing in ``ddp`` unpickles what a peer sent: no torch object collective (they pickle),
no ``pickle.load(s)``, and ``torch.load`` only with ``weights_only=True``. A scan of the
source, so that a new call anywhere in the package fails here."""

from __future__ import annotations

import ast
from pathlib import Path

import ddp

# torch.distributed's collectives that pickle on the sender and unpickle on the receiver
OBJECT_COLLECTIVES = {
    "broadcast_object_list",
    "all_gather_object",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
}


def _name(func: ast.expr) -> str:
    """``torch.load`` for ``torch.load(...)``, ``load`` for a bare ``load(...)``."""
    if isinstance(func, ast.Attribute):
        inner = _name(func.value)
        return f"{inner}.{func.attr}" if inner else func.attr
    return func.id if isinstance(func, ast.Name) else ""


def unpickling_calls(source: str, where: str) -> list[str]:
    """``where:line: call`` for every call in ``source`` that may unpickle foreign bytes."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        name = _name(node.func)
        last = name.rsplit(".", 1)[-1]
        bad = last in OBJECT_COLLECTIVES or name in ("pickle.load", "pickle.loads")
        if name == "torch.load":
            safe = any(
                k.arg == "weights_only"
                and isinstance(k.value, ast.Constant)
                and k.value.value is True
                for k in node.keywords
            )
            bad = not safe
        if bad:
            found.append(f"{where}:{node.lineno}: {name}")
    return found


def test_the_scan_finds_what_it_looks_for():
    source = (
        "import torch, pickle\n"
        "import torch.distributed as dist\n"
        "dist.broadcast_object_list(box, src=0)\n"
        "dist.all_gather_object(out, x)\n"
        "torch.load(f)\n"
        "torch.load(f, weights_only=False)\n"
        "pickle.loads(b)\n"
        "torch.load(f, map_location='cpu', weights_only=True)\n"
    )
    assert [c.split(": ")[1] for c in unpickling_calls(source, "x")] == [
        "dist.broadcast_object_list",
        "dist.all_gather_object",
        "torch.load",
        "torch.load",
        "pickle.loads",
    ]


def test_no_module_in_ddp_unpickles():
    root = Path(ddp.__file__).parent
    files = sorted(root.rglob("*.py"))
    assert len(files) > 50  # the package, not an empty directory
    found = [
        call
        for path in files
        for call in unpickling_calls(path.read_text(), str(path.relative_to(root.parent)))
    ]
    assert not found, "calls that unpickle what they read:\n" + "\n".join(found)
