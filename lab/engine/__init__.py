"""The job engine: everything lab asks of the Docker engine, in one place.

``client`` reaches the engine and names lab's errors; ``specs`` turns a run into plain dicts
for the SDK; ``cluster`` is the context manager that owns a run's containers, network and
volume; ``job`` runs a command on every rank of a started cluster and follows it as typed
events (``events``); ``training`` builds ddp's command line from a ``TrainConfig``; ``stats``
samples resources; ``image`` builds the lab image.
"""
