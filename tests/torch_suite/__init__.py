"""torch's own DDP tests, run against ``ddp.DistributedDataParallel`` in place of torch's class.

``python -m tests.torch_suite`` runs the DDP tests shipped in the torch wheel
(``torch/testing/_internal/distributed/distributed_test.py`` and
``ddp_under_dist_autograd_test.py``) on gloo/CPU, with our class swapped in inside the test
processes, and reports per test: pass, needs an API we refuse, or fail. See ``__main__.py``.

CI: the suite runs with the rest of ``pytest`` (``pytest -m torch_suite`` runs it alone, about
1-3 minutes on 2 cores with the stored baseline), and fails when a test that passes with torch's
class fails with ours for any reason other than an API our class refuses.
"""
