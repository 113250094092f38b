"""The direction of imports in the house (docs/layout.md), read from the source with ``ast``.

Every import counts: at the top, inside a function (a lazy import is still an arrow), and under
``TYPE_CHECKING``. Nothing is imported or run, so this stays fast.

* ``ddp`` is the library and its programs: it never imports ``lab`` (the Docker lab drives ddp,
  not the reverse) nor the docker SDK.
* ``lab/report`` is the generic page machinery: it imports no experiment (``lab.experiments``);
  each experiment builds its own page from it.
* ``ddp/recovery``'s protocol (``protocol/``: quorum, member, group, heal, ``waiting``) and its
  control plane (``etcd/``) import nothing from ``ddp.program``: any training loop can use them.
* The files of ``ddp/wrapper`` import each other without a circle, so each can be read after
  the ones it builds on.
* So do the files of ``lab/experiments/run``: ``run.py`` is the experiment, read top to bottom,
  and the ideas beside it (its faults, workers, hang) import nothing of it.
* ``lab kill`` is a package of one module per path (restart, torchrun, live), what they share
  and the command; the paths and the shared module never import the command, which imports
  them.
"""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_PROTOCOL = {"protocol", "etcd"}  # ddp/recovery/protocol/ and its control plane, ddp/recovery/etcd/


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


@cache
def _imports(path: Path) -> tuple[str, ...]:
    """The absolute names of every module ``path`` imports (``from a.b import c`` gives
    ``a.b.c`` and ``a.b``: ``c`` may be a module or a name in ``a.b``)."""
    tree = ast.parse(path.read_text(), str(path))
    package = _module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    names: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            names.append(base)
            names += [f"{base}.{alias.name}" for alias in node.names]
    return tuple(names)


def _sources(folder: str) -> list[Path]:
    return sorted((ROOT / folder).rglob("*.py"))


def _reaching(paths: list[Path], forbidden: str) -> list[str]:
    """``file: module`` for every import of ``forbidden`` (or a module under it)."""
    return [
        f"{p.relative_to(ROOT)}: {name}"
        for p in paths
        for name in _imports(p)
        if name == forbidden or name.startswith(forbidden + ".")
    ]


def test_ddp_imports_neither_lab_nor_docker():
    found = _reaching(_sources("ddp"), "lab") + _reaching(_sources("ddp"), "docker")
    assert not found, "ddp must not know the lab or Docker:\n" + "\n".join(found)


def test_lab_report_imports_no_experiment():
    found = _reaching(_sources("lab/report"), "lab.experiments")
    assert not found, "lab/report must import no experiment:\n" + "\n".join(found)


def test_recovery_protocol_imports_no_program():
    recovery = ROOT / "ddp" / "recovery"
    protocol = [
        p
        for p in _sources("ddp/recovery")
        if _PROTOCOL & set(p.relative_to(recovery).with_suffix("").parts)
    ]
    assert protocol, "no module of the recovery protocol found: update _PROTOCOL"
    found = _reaching(protocol, "ddp.program")
    assert not found, "the recovery protocol must not import ddp.program:\n" + "\n".join(found)


def test_kill_is_one_module_per_path():
    kill = ROOT / "lab" / "experiments" / "kill"
    names = sorted(p.relative_to(kill).as_posix() for p in kill.rglob("*.py"))
    assert names == ["__init__.py", "live.py", "restart.py", "shared.py", "torchrun.py"], (
        "lab/experiments/kill/ holds a module per path, the shared one and the command: "
        f"found {names}"
    )
    below = [p for p in kill.glob("*.py") if p.name != "__init__.py"]
    found = [f"{p.relative_to(ROOT)}" for p in below if "lab.experiments.kill" in _imports(p)]
    assert not found, "a path of lab kill imports the command:\n" + "\n".join(found)


def _circles(paths: list[Path]) -> list[list[str]]:
    """The import circles among ``paths``: strongly connected groups of two or more files,
    by Tarjan's algorithm."""
    by_name = {_module_name(p): p for p in paths}
    edges = {
        name: sorted({i for i in _imports(p) if i in by_name and i != name})
        for name, p in by_name.items()
    }
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = []
            while True:
                w = stack.pop()
                group.append(w)
                if w == v:
                    break
            if len(group) > 1:
                circles.append(sorted(group))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return circles


@pytest.mark.parametrize("folder", ["ddp/wrapper", "lab/experiments/run"])
def test_no_import_circles_in(folder):
    circles = _circles(_sources(folder))
    assert not circles, f"import circles in {folder}: " + "; ".join(
        " <-> ".join(group) for group in circles
    )


def test_the_circle_finder_finds_a_circle(tmp_path, monkeypatch):
    """The check above can fail: two files that import each other are a circle."""
    monkeypatch.setattr(f"{__name__}.ROOT", tmp_path)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    (tmp_path / "pkg" / "a.py").write_text("from pkg.b import f\n")
    (tmp_path / "pkg" / "b.py").write_text("def f():\n    from . import a\n")
    (tmp_path / "pkg" / "c.py").write_text("import pkg.a\n")
    assert _circles(sorted((tmp_path / "pkg").glob("*.py"))) == [["pkg.a", "pkg.b"]]
