"""One rank's training run, ``python -m ddp``: the configuration and its flags (``config``,
``flags``), the rendezvous and launch (``rendezvous``, ``launch``), the train loop (``train``)
with its models and data, the single-process reference and parity check (``reference``,
``parity``), the typed records a run writes (``records``, ``logs``), checkpoints
(``checkpoint``, ``resume``), and one exit code per outcome (``outcome``)."""
