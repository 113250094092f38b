"""The lab's dependencies are an extra: without them ``python -m lab`` says what is missing and
how to install it, in one line and exit 2, instead of an ImportError traceback."""

from __future__ import annotations

import importlib.util

import lab.__main__ as lab_main


def test_lab_without_its_extra_names_what_is_missing(monkeypatch, capsys):
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "docker" else real(name)
    )
    assert lab_main.main(["up", "--help"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "missing: docker)" in err and "pip install -c constraints.txt -e '.[lab]'" in err
