"""``python -m ddp.bench``: ours against torch's DDP on the same ranks (``rank``), interleaved
rounds, and the table and files it writes (``report``)."""
