"""``comm='auto'``: the bucket cap and the allreduce algorithm, measured, chosen, and re-chosen.

At construction every rank learns the layout (``topology``) and the wrapper registers one
communication hook whose algorithm can change between iterations: ``flat`` (a plain allreduce
over every rank, what torch's DDP does) or the two-level allreduce with the leaders' exchange by
ring, direct exchange or recursive doubling (``hierarchical``, ``cross_node``). Exact only:
nothing is compressed.

When it plans, on a fixed schedule of synchronised backwards so that every rank issues the
same collectives at the same step:

1. At the bucket rebuild (before the second synchronised forward): every rank times plain
   allreduces on the world group, each node's ranks on their node's group, the leaders a direct
   exchange among themselves. Rank 0 fits the links, builds the cost model (``comm_plan``) with
   its own backward's gradient-ready times, chooses (cap, algorithm) and broadcasts the plan as
   JSON; every rank rebuilds its buckets with the cap and switches the hook's algorithm.
2. Every ``CHECK_EVERY`` backwards after a plan: rank 0 decides from its own steps (the
   reducer's stamps: when backward began and when the last bucket was done) and broadcasts.
   At the first check of a plan it learns what a call really costs under it (``learn_call_s``:
   a bare probe prices a call at a third of what it costs in a step; a plan of one bucket
   teaches nothing), re-chooses with that, and switches if it learned something and the new
   choice is predicted 5% faster; the plan's times become the baseline. At later checks a
   window that moved away from the baseline (``replan``) makes every rank re-measure and
   re-plan.

Under torch's DDP (``plan_once``), whose buckets cannot be laid out anew, only the hook part
applies: before training, every rank probes, and rank 0 chooses the algorithm for torch's
own cap (25 MB) with every gradient taken as ready at once (torch's stamps are not ours to
read); that plan stays.

Every plan is kept (``records``, for the training program's logs, and the ``comm_plan`` entry
of ``_get_ddp_logging_data()``): the step it starts at, cap, algorithm, predicted and measured
end of communication (ms after backward began) and why.
"""

# No ``from __future__ import annotations``: torch's register_comm_hook compares the hook's
# annotations with dist.GradBucket and Future[Tensor] objects, and strings would not match.
import dataclasses
import json
import statistics
import time
from typing import Any, Optional

import torch
import torch.distributed as dist

from ddp.wrapper.auto_cap import MAX_BYTES_PER_S, LinkModel, fit_link
from ddp.wrapper.auto_tune import PROBE_BYTES, PROBE_REPS, measure_link
from ddp.wrapper.comm_plan import CommModel, Plan, choose_plan, learn_call_s, predict_plan
from ddp.wrapper.cross_node import start as start_cross
from ddp.wrapper.hierarchical import HierarchicalState
from ddp.wrapper.replan import link_changed
from ddp.wrapper.topology import Topology, gather_node_names
from ddp.wrapper.wire import broadcast_json

__all__ = ["CHECK_EVERY", "AutoComm", "AutoCommState", "auto_comm_hook", "ends_fit"]

CHECK_EVERY = 4  # backwards between two checks of the plan in force
SWITCH_GAIN = 0.95  # a re-choice replaces the plan in force if predicted this much faster
MAX_SWITCHES = 3  # calibration switches per measurement of the link (no endless flip-flop)
_KEEP = 64  # measurements kept (a window never needs more than CHECK_EVERY)


class AutoCommState:
    """The hook's state: the algorithm in force and the two-level machinery (None on one
    node). A collective to build: the hierarchical groups are created on every rank."""

    def __init__(self, topology: Topology) -> None:
        self.topology = topology
        self.world = topology.world_size
        self.algorithm = "flat"  # torch's, until the first plan
        self.hierarchical = HierarchicalState(topology) if len(topology.nodes) > 1 else None


def auto_comm_hook(
    state: AutoCommState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """``hook(state, bucket)``: the bucket's average by the algorithm in force."""
    if state.algorithm == "flat" or state.hierarchical is None:
        buffer = bucket.buffer().div_(state.world)
        fut = dist.all_reduce(buffer, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])
    state.hierarchical.cross_algorithm = state.algorithm
    return state.hierarchical.submit(bucket.buffer(), bucket.is_last())


class AutoComm:
    """The planner of one wrapper: owns the hook's state, probes, decides, records."""

    def __init__(self, model: Any, world_size: int) -> None:
        names = gather_node_names()
        self.topology = Topology.from_names(names)
        if self.topology.world_size != world_size:
            raise ValueError("comm='auto' runs on the default (world) process group")
        self.state = AutoCommState(self.topology)
        model.register_comm_hook(self.state, auto_comm_hook)
        self.rank = dist.get_rank()
        self.records: list[dict[str, Any]] = []  # every plan decision, oldest first
        self._unread = 0  # records the training program has not taken yet
        self._model: Optional[CommModel] = None  # noqa: UP045
        self._plan: Optional[Plan] = None  # noqa: UP045
        self._call_s: dict[str, float] = {}  # learned per algorithm
        self._since = 0  # the backward count the plan in force started after
        self._seen = 0  # backward count already measured
        self._series: list[float] = []  # rank 0: end of communication per backward, s
        self._baseline: list[float] = []
        self._settled = False
        self._switches = 0
        self._step = 0

    # ---- the schedule, the same on every rank ------------------------------------------------

    def before_forward(self, reducer: Any, logging: Any) -> Optional[float]:  # noqa: UP045
        """Before each synchronised forward (or a joined rank's shadow of one), on every rank.
        Returns the new bucket cap (MB) when the buckets must be laid out anew, else None."""
        count = reducer.synced_backwards
        # the step the coming forward belongs to: the training loop's label, else the count
        self._step = reducer.step if reducer.step >= 0 else count + 1
        if count > self._seen:
            self._seen = count
            stamps = reducer.last_stamps
            self._series.append(stamps["backward_comm_end"] - stamps["backward_compute_start"])
            del self._series[:-_KEEP]
        if reducer.rebuild_due():
            return self._first_plan(reducer, logging, count)
        if self._plan is None or count <= self._since or (count - self._since) % CHECK_EVERY:
            return None
        return self._check(reducer, logging, count)

    def _first_plan(self, reducer: Any, logging: Any, count: int) -> float:
        plan = self._probe_and_choose(reducer, "first plan: measured the links")
        return self._adopt(plan, None, reducer, logging, count)

    def _check(self, reducer: Any, logging: Any, count: int) -> Optional[float]:  # noqa: UP045
        decision = None
        if self.rank == 0:
            decision = self._decide(reducer)
        decision = broadcast_json(decision, src=0)
        action = decision["action"]
        if action == "keep":
            self._settled = True
            self._baseline = list(decision["baseline"])
            if decision.get("record"):
                self._record(decision["record"], logging)
            return None
        if action == "probe":
            plan = self._probe_and_choose(reducer, decision["reason"])
            self._switches = 0
        else:
            plan = _plan_from_json(decision["plan"])
            self._call_s = {k: float(v) for k, v in decision["call_s"].items()}
            self._switches += 1
        return self._adopt(plan, decision.get("measured_s"), reducer, logging, count)

    # ---- rank 0's decisions --------------------------------------------------------------------

    def _window(self) -> list[float]:
        """This plan's measurements since its first backward (which may pay for the new
        layout's allocation), at most the last CHECK_EVERY - 1."""
        n = self._seen - self._since
        return self._series[-n:][1:][-(CHECK_EVERY - 1) :] if n > 1 else []

    def _decide(self, reducer: Any) -> dict[str, Any]:
        plan, model = self._plan, self._model
        assert plan is not None and model is not None
        window = self._window()
        measured = statistics.median(window) if window else None
        if self._settled:
            if link_changed(self._baseline, window):
                was, now = statistics.median(self._baseline), measured or 0.0
                reason = (
                    f"the link changed: communication ended {now * 1e3:.1f} ms after backward "
                    f"began, {was * 1e3:.1f} ms when the plan settled; measuring again"
                )
                return {"action": "probe", "reason": reason, "measured_s": measured}
            return {"action": "keep", "baseline": self._baseline}
        # The plan's first check: learn what one call costs under it, then choose again.
        ready = reducer.ready_profile() or [(0.0, 4)]
        per_step = [learn_call_s(ready, model, plan.cap_mb, plan.algorithm, t) for t in window]
        learnt = [t for t in per_step if t is not None]
        if learnt:
            self._call_s[plan.algorithm] = statistics.median(learnt)
        learned = dict(self._call_s)
        # nothing learned yet (one bucket so far): the probe's prices stay
        calls = _calls(learned, 0.0) if learned else dict(model.call_s)
        model = _with_calls(model, calls)
        current = predict_plan(ready, model, plan.cap_mb, plan.algorithm)
        best = choose_plan(ready, model, algorithms=self._algorithms())
        call_ms = calls[plan.algorithm] * 1e3
        # only what was learned may move the plan: without it, a new prediction differs from
        # the old by the last backward's ready times alone, which is noise
        better = best.predicted_s < current * SWITCH_GAIN
        if learnt and better and self._switches < MAX_SWITCHES:
            reason = (
                f"a call costs {call_ms:.2f} ms under {plan.algorithm} (learned from "
                f"{len(learnt)} steps, measured {_ms(measured)} ms against "
                f"{plan.predicted_s * 1e3:.1f} predicted): {best.cap_mb} MB {best.algorithm} "
                f"predicted {best.predicted_s * 1e3:.1f} ms, the plan in force {current * 1e3:.1f}"
            )
            self._model = model
            return {
                "action": "plan",
                "plan": _plan_to_json(best, reason, model),
                "call_s": learned,
                "measured_s": measured,
            }
        self._model = model
        record = _record(
            self._step, plan, current, measured, model,
            f"kept: {call_ms:.2f} ms per call "
            + (f"learned from {len(learnt)} steps" if learnt else "(one bucket: not learned)")
            + f"; no plan predicted {100 - SWITCH_GAIN * 100:.0f}% faster",
            changed=False,
        )  # fmt: skip
        self._baseline = window
        return {"action": "keep", "baseline": window, "record": record}

    def plan_once(self, params: Any, cap_mb: float) -> None:
        """Torch's DDP: choose the algorithm for buckets of ``cap_mb`` now, once (see the
        module docstring). A collective: every rank, before training."""
        sizes = [p.numel() * p.element_size() for p in params if p.requires_grad]
        ready = [(0.0, n) for n in reversed(sizes)]
        links = _probe(self.state, sum(sizes))
        decided = None
        if self.rank == 0:
            model = self._fit(links)
            plan = choose_plan(ready, model, caps=(cap_mb,), algorithms=self._algorithms())
            why = f"torch's DDP: the algorithm for its own {cap_mb} MB cap, planned once"
            decided = _plan_to_json(plan, why, model)
        plan = _plan_from_json(broadcast_json(decided, src=0))
        self.state.algorithm = plan.algorithm
        self._plan = plan
        self.records.append(_record(1, plan, plan.predicted_s, None, None, plan.reason, True))
        self._unread += 1

    def _algorithms(self) -> tuple[str, ...]:
        return _ALL if self.state.hierarchical is not None else ("flat",)

    # ---- measuring and adopting, collectives on every rank ---------------------------------

    def _probe_and_choose(self, reducer: Any, why: str) -> Plan:
        t0 = time.perf_counter()
        links = _probe(self.state, sum(reducer.bucket_sizes))
        probe_s = time.perf_counter() - t0
        decided = None
        if self.rank == 0:
            model = self._fit(links)
            ready = reducer.ready_profile() or [(0.0, 4)]
            plan = choose_plan(ready, model, algorithms=self._algorithms())
            self._model = model
            reason = f"{why} ({probe_s * 1e3:.0f} ms of probes)"
            decided = _plan_to_json(plan, reason, model)
        return _plan_from_json(broadcast_json(decided, src=0))

    def _fit(self, links: dict[str, Any]) -> CommModel:
        topo = self.topology
        flat = fit_link(links["world"])
        cpu = links["cpu_s"]
        k = len(topo.node_of(0))
        m = len(topo.nodes)
        local = None
        if links.get("local"):
            fit = fit_link(links["local"])
            hops = 2 * (k - 1)
            local = LinkModel(fit.latency_s / hops, fit.bytes_per_s * hops / k)
        cross = flat
        if links.get("cross"):
            fit = ends_fit(links["cross"])  # a direct exchange: 1 latency, (M-1) x the bytes
            cross = LinkModel(fit.latency_s, fit.bytes_per_s * (m - 1))
        ring = fit_link(links["leaders"]) if links.get("leaders") else None
        calls = _calls(self._call_s, cpu)
        return CommModel(topo.world_size, m, k, cross, local, flat, calls, ring)

    def _adopt(
        self,
        plan: Plan,
        previous_measured_s: Optional[float],  # noqa: UP045 (rank 0's, broadcast)
        reducer: Any,
        logging: Any,
        count: int,
    ) -> float:
        self.state.algorithm = plan.algorithm
        self._plan = plan
        self._since = count
        self._settled = False
        self._baseline = []
        rec = _record(self._step, plan, plan.predicted_s, None, None, plan.reason, True)
        rec["previous_measured_ms"] = _ms(previous_measured_s)
        self._record(rec, logging)
        return plan.cap_mb

    def _record(self, rec: dict[str, Any], logging: Any) -> None:
        self.records.append(rec)
        self._unread += 1
        # torch's key names hold strings or ints: the plan travels as JSON, as auto_bucket_cap
        logging.data["comm_plan"] = json.dumps({**rec, "plans": len(self.records)})

    def take_records(self) -> list[dict[str, Any]]:
        """The decisions made since the last call, oldest first (for the program's logs)."""
        out = self.records[len(self.records) - self._unread :] if self._unread else []
        self._unread = 0
        return out


_ALL = ("flat", "ring", "direct", "recursive-doubling")
_DIRECT_WARMUP = 3  # untimed exchanges before the leaders' direct exchange is timed


def _probe(state: AutoCommState, max_bytes: int) -> dict[str, Any]:
    """Timings of every link this rank is on: a world allreduce (every rank), its node's
    allreduce (ranks of nodes with several), a direct exchange among the leaders (leaders of
    two or more nodes). Fixed sizes and counts: every rank issues the same collectives."""
    world, cpu = measure_link(None, max_bytes)
    out: dict[str, Any] = {"world": world, "cpu_s": cpu}
    hier = state.hierarchical
    if hier is None:
        return out
    if hier.local is not None:
        out["local"], _ = measure_link(hier.local, max_bytes)
    if hier.is_leader:
        out["cross"] = _time_direct(hier, max_bytes)
        # gloo's ring among the leaders, timed as it runs: a direct exchange sends each
        # leader's whole buffer at once, both ways, and on a rate-capped link its throughput
        # fell to half the ring's (whose pipelined chunks keep both directions' ACKs flowing:
        # 1.2 against 2.3 MB/s at 20 Mbit/s), so one probe cannot price both
        out["leaders"], _ = measure_link(hier.cross, max_bytes)
    return out


def _time_direct(hier: HierarchicalState, max_bytes: int) -> list[tuple[int, float]]:
    leaders = hier.topology.leaders
    dist.all_reduce(torch.zeros(1), group=hier.cross)  # line the leaders up
    seq = 1 << 23  # tags apart from the hook's (its sequence starts at 0)
    # Untimed exchanges of the largest size first: the leaders' pairs have carried nothing
    # yet, and TCP's slow start would price a cold connection where a step's buckets find a
    # warm one, its window grown over the steps before (at 5 ms one-way, cold: 67 MB/s; after
    # one warm exchange 90; the ring allreduce timed after them: 175-199).
    warm = max(4, min(max(PROBE_BYTES), max_bytes))
    for _ in range(_DIRECT_WARMUP):
        start_cross("direct", torch.zeros(warm // 4), hier.cross, leaders, seq).wait()
        seq += 1
    best: dict[int, float] = {}
    reps = (*PROBE_REPS[:-1], 2)  # the largest size twice: the fastest of a warm pair counts
    for n, k in zip(PROBE_BYTES, reps, strict=True):
        size = max(4, min(n, max_bytes))
        for _ in range(k):
            t = torch.zeros(size // 4)
            t0 = time.perf_counter()
            start_cross("direct", t, hier.cross, leaders, seq).wait()
            seq += 1
            best[size] = min(best.get(size, float("inf")), time.perf_counter() - t0)
    if len(best) < 2:  # a tiny model: two sizes still give a slope
        best[8] = best.get(8, best[min(best)])
    return sorted(best.items())


def ends_fit(samples: list[tuple[int, float]]) -> LinkModel:
    """``latency + bytes / bandwidth`` through the smallest and the largest sample: the
    latency is the smallest size's time, the bandwidth the slope to the largest. For the
    leaders' direct exchange, which runs on point-to-point pairs that have carried nothing yet:
    TCP's slow start gives its middle sizes extra round trips (at 5 ms one-way, a least-squares
    line through them put 17 ms of latency on a 5 ms link), and the ends are what a bucket of
    a few KB and one of a MB or more cost."""
    (n0, t0), (n1, t1) = min(samples), max(samples)
    slope = (t1 - t0) / (n1 - n0) if n1 > n0 else 0.0
    return LinkModel(max(t0 - slope * n0, 0.0), 1.0 / max(slope, 1.0 / MAX_BYTES_PER_S))


def _calls(learned: dict[str, float], probed_s: float) -> dict[str, float]:
    """Each algorithm's cost per call: learned where it ran; elsewhere the dearest learned
    one (a call in this process costs about that whatever the algorithm), else the probe's."""
    default = max(learned.values(), default=probed_s)
    return {a: learned.get(a, default) for a in _ALL}


def _with_calls(model: CommModel, calls: dict[str, float]) -> CommModel:
    return dataclasses.replace(model, call_s=calls)


def _ms(seconds: Optional[float]) -> Optional[float]:  # noqa: UP045
    return None if seconds is None else round(seconds * 1e3, 3)


def _record(
    step: int,
    plan: Plan,
    predicted_s: float,
    measured_s: Optional[float],  # noqa: UP045
    model: Optional[CommModel],  # noqa: UP045
    reason: str,
    changed: bool,
) -> dict[str, Any]:
    rec: dict[str, Any] = {
        "step": step,
        "cap_mb": plan.cap_mb,
        "algorithm": plan.algorithm,
        "predicted_ms": _ms(predicted_s),
        "measured_ms": _ms(measured_s),
        "reason": reason,
        "changed": changed,
    }
    if model is not None:
        rec["call_ms"] = {a: _ms(t) for a, t in model.call_s.items()}
    return rec


def _plan_to_json(plan: Plan, reason: str, model: CommModel) -> dict[str, Any]:
    """A plan for the wire: floats exact (repr round-trips), plus the model's links in ms and
    MB/s for the logs."""

    def link(m: Optional[LinkModel]) -> Optional[list[float]]:  # noqa: UP045
        return None if m is None else [m.latency_s, m.bytes_per_s]

    return {
        "cap_mb": plan.cap_mb,
        "algorithm": plan.algorithm,
        "predicted_s": plan.predicted_s,
        "reason": reason,
        "links": {
            "cross": link(model.cross),
            "local": link(model.local),
            "flat": link(model.flat),
            "ring": link(model.ring),
        },
        "call_s": dict(model.call_s),
        "best": sorted(
            ([c, a, t] for (c, a), t in plan.candidates.items()), key=lambda row: row[2]
        )[:6],
    }


def _plan_from_json(data: dict[str, Any]) -> Plan:
    cap, algorithm, predicted = float(data["cap_mb"]), str(data["algorithm"]), data["predicted_s"]
    return Plan(cap, algorithm, float(predicted), {}, _describe(data))


def _describe(data: dict[str, Any]) -> str:
    """The reason, with the fitted links and the runners-up: why this plan, in one line."""

    def link(v: Optional[list[float]]) -> str:  # noqa: UP045
        return "-" if v is None else f"{v[0] * 1e3:.3f} ms + {v[1] / (1 << 20):.1f} MB/s"

    links = data.get("links", {})
    calls = ", ".join(f"{a} {t * 1e3:.2f}" for a, t in data.get("call_s", {}).items())
    best = "; ".join(f"{c} MB {a} {t * 1e3:.1f}" for c, a, t in data.get("best", []))
    return (
        f"{data['reason']}; links: cross {link(links.get('cross'))}, leaders' ring "
        f"{link(links.get('ring'))}, local {link(links.get('local'))}, world allreduce "
        f"{link(links.get('flat'))}; ms per call: "
        f"{calls}; fastest predicted (ms): {best}"
    )
