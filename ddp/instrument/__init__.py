"""Seeing inside a training script nobody changed: every ``DistributedDataParallel`` it builds
(torch's, or ours from :mod:`ddp.wrapper`) reports its steps, keeps a flight recorder that
dumps on demand, and leaves a digest of its parameters at exit.

The pieces, one idea per file:

* :mod:`ddp.instrument.env`: the environment contract (which variables switch it on, where
  the records go) and the environment a launcher sets.
* :mod:`ddp.instrument.records`: the typed records it writes (torch-free).
* ``ddp/instrument/site/sitecustomize.py``: the activation, put on ``PYTHONPATH``.
* :mod:`ddp.instrument.activate`: patches the classes when their modules are imported.
* :mod:`ddp.instrument.patch`: what a patched class does at construction, forward and
  ``register_comm_hook``.
* :mod:`ddp.instrument.hook`: the comm hook every torch DDP gets, wrapping the default
  allreduce or the script's own hook.
* :mod:`ddp.instrument.tally`: a flight recorder that also counts each step's collectives.
* :mod:`ddp.instrument.session`: the per-process state (rank, record log, recorder, exit).
* :mod:`ddp.instrument.trigger`: the flight recorder's dump on demand (a signal or a file).
* :mod:`ddp.instrument.bench`: what it costs, instrumented vs not.

This package imports nothing heavy: a launcher (the lab) imports :mod:`ddp.instrument.env`
without torch.
"""
