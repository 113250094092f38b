"""DDP logging data: what ``_get_ddp_logging_data()`` returns, with torch's keys.

Tools and users written against torch's DDP read these keys (construction settings, bucket
sizes, the comm hook's name, join and static-graph use, and sampled per-iteration timings), so
they keep torch's names, units (integer nanoseconds) and sampling rule: timings are taken in
the first 10 iterations and then every ``sample_rate``-th, and, as in torch, the stats of
iteration k-1 are recorded at the start of forward k and labelled ``iteration = k``.

Timings on CPU, from host-side stamps: forward = forward start to the end of forward
(``prepare_for_backward``); backward compute = end of forward to the end of backward; backward
comm = first bucket launch to the last bucket done; overlap = first bucket launch to the end of
backward (the part of communication hidden behind compute).
"""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

__all__ = ["DDPLoggingData"]

_DTYPE_NAMES = {
    torch.float32: "float",
    torch.float64: "double",
    torch.float16: "c10::Half",
    torch.bfloat16: "c10::BFloat16",
}
_ENV_KEYS = {
    "master_addr": "MASTER_ADDR",
    "master_port": "MASTER_PORT",
    "torch_distributed_debug": "TORCH_DISTRIBUTED_DEBUG",
    "cuda_visible_devices": "CUDA_VISIBLE_DEVICES",
    "gloo_socket_ifname": "GLOO_SOCKET_IFNAME",
    "gloo_device_transport": "GLOO_DEVICE_TRANSPORT",
}
_ALWAYS_SAMPLED = 10
_PHASES = ("forward_compute", "backward_compute", "backward_comm", "backward_compute_comm_overlap")


def _group_facts(group: dist.ProcessGroup | None) -> tuple[int, int, str]:
    """World size, rank and backend of ``group``. A group built directly (live recovery builds
    a ``ProcessGroupGloo`` per quorum, outside torch's registry) answers for itself."""
    if group is not None and group not in dist.distributed_c10d._world.pg_map:
        return group.size(), group.rank(), group.name()
    return dist.get_world_size(group), dist.get_rank(group), str(dist.get_backend(group))


class DDPLoggingData:
    """Construction-time facts plus sampled runtime stats of one wrapper."""

    def __init__(
        self,
        module: torch.nn.Module,
        params: Sequence[torch.Tensor],
        bucket_sizes: Sequence[int],
        process_group: dist.ProcessGroup | None,
        settings: dict[str, int],
    ) -> None:
        world, rank, backend = _group_facts(process_group)
        self.data: dict[str, str | int] = {
            "world_size": world,
            "rank": rank,
            "module_name": type(module).__name__,
            "device_ids": "",
            "output_device": -1,
            "backend_name": backend,
            "is_multi_device_module": 0,
            "num_parameter_tensors": len(params),
            "total_parameter_size_bytes": sum(p.numel() * p.element_size() for p in params),
            "dtypes": ", ".join(sorted({_DTYPE_NAMES.get(p.dtype, str(p.dtype)) for p in params})),
            "bucket_sizes": ", ".join(str(s) for s in bucket_sizes),
            "has_sync_bn": int(any(isinstance(m, nn.SyncBatchNorm) for m in module.modules())),
            "has_rebuilt_buckets": 0,  # until the reducer rebuilds (ddp.wrapper.reducer)
            "iteration": 0,
            **settings,
            **{key: os.environ.get(var, "N/A") for key, var in _ENV_KEYS.items()},
        }
        if self.data["backend_name"] == "gloo":
            self.data["gloo_num_threads"] = 2  # ProcessGroupGloo's default, as torch logs it
        self.sample_rate = 100
        self.param_index: list[int] | None = None  # reducer index -> index in ``params``
        self.iterations = 0  # synchronised forwards started
        self._samples = 0
        self._forward_start = 0.0
        # perf_counter() -> wall-clock nanoseconds, for torch's absolute *_start/_end stamps
        self._epoch_offset_ns = time.time_ns() - time.perf_counter_ns()

    def log_error(self, error: Exception) -> Exception:
        """Keep ``error`` in the logging data (torch's ``has_error``/``error`` keys), for tools
        that read why a wrapper failed; returns it, to be raised."""
        self.data["has_error"] = 1
        self.data["error"] = str(error)
        return error

    def set_sample_rate(self, sample_rate: int) -> None:
        if not isinstance(sample_rate, int) or sample_rate < 1:
            raise ValueError(
                "DDP runtime logging sample rate should be equal or greater than 1, got "
                f"{sample_rate!r}"
            )
        self.sample_rate = sample_rate

    def on_forward(self, reducer: Any) -> None:
        """At the start of a synchronised forward: record the previous iteration if sampled
        (from the reducer's ``last_stamps`` and ``last_unused_bytes``, the size of the
        parameters that got no gradient on some rank then)."""
        k = self.iterations
        if k > 0 and (k <= _ALWAYS_SAMPLED or k % self.sample_rate == 0):
            self._record(k, reducer.last_stamps)
            self.data["unused_parameter_size"] = reducer.last_unused_bytes
            if reducer.last_ready_order:
                order = self._indices(reducer.last_ready_order)
                self.data["prev_iteration_grad_ready_order_indices"] = ", ".join(order)
        self.iterations = k + 1
        self._forward_start = time.perf_counter()

    def on_rebuild(self, reducer: Any) -> None:
        """After the reducer rebuilt its buckets: torch's ``rebuilt_*`` keys (sizes in bytes,
        and each bucket's parameter indices, space-separated, buckets comma-separated)."""
        self.data["has_rebuilt_buckets"] = 1
        self.data["rebuilt_bucket_sizes"] = ", ".join(str(s) for s in reducer.bucket_sizes)
        per_bucket = [" ".join(self._indices(spec.indices)) for spec in reducer.plan]
        self.data["rebuilt_per_bucket_param_indices"] = ", ".join(per_bucket)

    def _indices(self, indices: Sequence[int]) -> list[str]:
        index = self.param_index
        return [str(i if index is None else index[i]) for i in indices]

    def _record(self, k: int, s: dict[str, float]) -> None:
        spans = {
            "forward_compute": (self._forward_start, s["backward_compute_start"]),
            "backward_compute": (s["backward_compute_start"], s["backward_compute_end"]),
            "backward_comm": (s["backward_comm_start"], s["backward_comm_end"]),
            "backward_compute_comm_overlap": (s["backward_comm_start"], s["backward_compute_end"]),
        }
        self._samples += 1
        n = self._samples
        for phase in _PHASES:
            start, end = spans[phase]
            ns = max(0, round((end - start) * 1e9))
            self.data[f"{phase}_time"] = ns
            avg = self.data.get(f"avg_{phase}_time", 0)
            assert isinstance(avg, int)
            self.data[f"avg_{phase}_time"] = (avg * (n - 1) + ns) // n
            if phase != "backward_compute_comm_overlap":
                self.data[f"{phase}_time_start"] = self._wall_ns(start)
                self.data[f"{phase}_time_end"] = self._wall_ns(end)
        self.data["iteration"] = k

    def _wall_ns(self, t: float) -> int:
        return round(t * 1e9) + self._epoch_offset_ns
