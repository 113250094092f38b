"""What runs inside a node container: standard library only (the image's Python, no docker SDK).

``python -m lab.node`` is the launcher of a job's ranks (:mod:`lab.node.launcher`); it shares
one small protocol with the host side (:mod:`lab.node.protocol`): how an output line names its
node and rank, and the exit record. Link shaping runs two more programs in the nodes: the
NFQUEUE packet delayer (``python -m lab.node.delayer``) and the TCP echo probe that measures
the link (``python -m lab.node.probe serve|ping|bulk``).
"""
