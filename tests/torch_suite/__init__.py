"""torch's own DDP tests, run against ``ddp.DistributedDataParallel`` in place of torch's class.

``python -m tests.torch_suite`` runs the DDP tests shipped in the torch wheel
(``torch/testing/_internal/distributed/distributed_test.py`` and
``ddp_under_dist_autograd_test.py``) on gloo/CPU, with our class swapped in inside the test
processes, and reports per test: pass, needs an API we refuse, or fail. See ``__main__.py``.

CI: ``pytest -m torch_suite`` takes 15-30 s on 2 cores (stored baseline), well inside CI's
5-minute budget, but it is off in the default ``pytest`` run while it fails (tests that need
only supported API still fail on the ddp-api work in progress). Once ``python -m
tests.torch_suite`` exits 0, drop ``and not torch_suite`` from ``addopts`` in pyproject.toml.
"""
