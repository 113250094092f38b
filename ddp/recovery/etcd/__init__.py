"""Live recovery's control plane on etcd: a client of etcd's JSON gateway (``client``), a job's
own three-member cluster with mutual TLS (``cluster``), and a ``torch.distributed.Store`` over
etcd (``store``) that gloo's rendezvous runs through.
"""
