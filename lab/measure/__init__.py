"""What the lab measures in a run, one module per measurement, imported by every experiment
that needs it: the steps every rank logged after warm-up (:mod:`.windows`), a job's figures
over them (:mod:`.job_figures`), each bucket's fill and allreduce times (:mod:`.buckets`), each
node's eth0 byte counters (:mod:`.counters`), the lab's own moments on a run's timeline
(:mod:`.moments`).
Docker-free except :mod:`.counters`' sampler, which runs in the nodes."""

from __future__ import annotations

__all__: list[str] = []
