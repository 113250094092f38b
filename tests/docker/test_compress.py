"""Docker tier: ``python -m lab compress --quick`` end to end -- real containers behind a real,
verified bandwidth cap, real gloo ranks with torch's comm hooks -- its figures, files, and
nothing labelled ``lab.run`` left behind. Run with
``pytest -m docker tests/docker/test_compress.py``."""

from __future__ import annotations

import json
import re

import pytest

from lab.experiments.compress import QUICK
from tests.docker.lab_run import PNG, run_lab

pytestmark = pytest.mark.docker


@pytest.mark.timeout(900)
def test_compress_quick_end_to_end(client, tmp_path):
    out, run_id = run_lab(client, ["compress", "--quick", "--runs-dir", str(tmp_path)], 840)
    assert f"labelled lab.run={run_id}" in out
    assert re.search(rf"^progress: step {QUICK.steps}/{QUICK.steps}", out, re.M), out
    assert "crossover (speedup vs none, Mbit/s):" in out

    run_dir = tmp_path / run_id
    doc = json.loads((run_dir / "compress.json").read_text())
    low, high = min(QUICK.rates), max(QUICK.rates)
    # Every rate was verified by the probe's bulk transfer before anything trained.
    assert sorted(link["rate_mbit"] for link in doc["links"]) == sorted(QUICK.rates)
    for link in doc["links"]:
        assert 0.6 * link["rate_mbit"] <= link["measured_mbit"] <= 1.1 * link["rate_mbit"], link
    rows = {(r["rate_mbit"], r["hook"]): r for r in doc["rows"]}
    assert set(rows) == {(rate, h) for rate in QUICK.rates for h in QUICK.hooks}
    assert all(r["parity"] for r in rows.values()), rows  # replicas identical in every job
    none, fp16, psgd = (rows[(low, h)] for h in ("none", "fp16", "powersgd"))
    # At the low cap the allreduce is bandwidth-bound: half the bytes (fp16) or ~1% of them
    # (powersgd) must show in the step time, with margin for a loaded host.
    assert fp16["median_step_ms"] < 0.8 * none["median_step_ms"], (fp16, none)
    assert psgd["median_step_ms"] < 0.5 * none["median_step_ms"], (psgd, none)
    assert fp16["speedup_vs_none"] > 1.25
    for rate in QUICK.rates:
        n, f = rows[(rate, "none")], rows[(rate, "fp16")]
        # The interfaces carried what the derivation says, and fp16 really sent less.
        assert f["job_sent_mb"] < 0.8 * n["job_sent_mb"], (f, n)
        for r in (n, f, rows[(rate, "powersgd")]):
            assert r["job_sent_mb"] >= 0.95 * r["job_wire_mb"], r
        assert f["wire_mb"] == pytest.approx(n["wire_mb"] / 2, rel=1e-3)
    # The price of compressing, reported: none is exact to float rounding, the hooks are not.
    assert none["max_param_diff"] < 1e-6
    assert min(fp16["max_param_diff"], psgd["max_param_diff"]) > 10 * none["max_param_diff"]
    assert none["loss_vs_none"] == 0.0 and fp16["loss_vs_none"] is not None
    hooks = [c["hook"] for c in doc["crossovers"]]
    assert hooks == [h for h in QUICK.hooks if h != "none"]
    assert doc["crossovers"][0]["rates"] == [low, high]

    assert (run_dir / "compress.png").read_bytes()[:8] == PNG
    assert (run_dir / "compress.txt").read_text().startswith(f"{QUICK.nodes} ranks")
    assert (run_dir / "compress.csv").read_text().count("\n") == 1 + len(rows)
    trace = json.loads((run_dir / "trace.json").read_text())
    procs = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"]
    assert len(procs) == len(QUICK.hooks) and all(p.startswith(f"{low:g} Mbit/s") for p in procs)
