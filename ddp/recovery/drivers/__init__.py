"""Programs on ``ddp.recovery.api``, clients of it like any user's loop: ``python -m ddp
--recovery live`` (``live``, ``step``, ``job``, ``batches``: the loop of one rank; ``local``,
``rank``, ``cli``, ``settings``: its processes, flags and checks; ``timeline``, ``verdict``,
``endurance``: what it reports), and ``tft``: the same job under torchft's ``Manager``, side by
side.
"""
