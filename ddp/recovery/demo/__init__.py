"""The demo program's live run, a client of ``ddp.recovery.api`` like any user's loop: ``python -m
ddp train --recovery live`` (``live``, ``step``, ``job``, ``batches``: the loop of one rank;
``rank``, ``cli``, ``settings``: its process, flags and checks; ``timeline``, ``verdict``: what
it reports), and ``torchft``: the same job under torchft's ``Manager``, side by side. The
processes of a whole local job are started by ``ddp.recovery.harness``.
"""
