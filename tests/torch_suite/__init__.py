"""torch's own DDP tests, run against ``ddp.DistributedDataParallel`` in place of torch's class.

``python -m tests.torch_suite`` runs the DDP tests shipped in the torch wheel
(``torch/testing/_internal/distributed/distributed_test.py``) on gloo/CPU, with our class
swapped in inside the test processes, and reports per test: pass, needs an API we refuse, or
fail. See ``tests/torch_suite/__main__.py`` for the command line.
"""
