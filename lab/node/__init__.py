"""What runs inside a node container: standard library only (the image's Python, no docker SDK).

``python -m lab.node`` is the launcher of a job's ranks (:mod:`lab.node.launcher`); it shares
one small protocol with the host side (:mod:`lab.node.protocol`): how an output line names its
node and rank, and the exit record.
"""
