"""A plain training loop with live recovery: its own model, optimizer, LR scheduler and data,
wrapped by ``ddp.wrapper``'s ``DistributedDataParallel`` or torch's, and ten lines marked
``# recovery`` for ``ddp.recovery.api`` (``--records`` is optional, for
``python -m ddp.recovery.harness.launch``). The launcher starts the job's control plane (its
own etcd, with a certificate and a secret made for the job, and a decider), then the replicas:

    python -m ddp.recovery.harness.launch --world-size 3 --kill-rank 1 --kill-at-step 6 \\
        --rejoin examples/recovery_loop.py --steps 200 --compute-ms 40

A killed replica (``kill -9``): the others go on at world 2 within a fraction of a second.
A replacement (the same ``RANK``) joins at the next step boundary, receives the state of a
healthy replica, and trains on. Each process ends by printing the digest of its parameters: every
replica that finished prints the same one.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

import torch
import torch.nn.functional as F
from torch import nn

from ddp.recovery.api import Manager

X = torch.randn(4096, 16, generator=torch.Generator().manual_seed(0))  # a fixed regression task


def batch(step: int, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of ``step``: the same on every replica, whatever the world."""
    idx = torch.randint(0, len(X), (size,), generator=torch.Generator().manual_seed(step))
    return X[idx], torch.sin(X[idx] @ torch.ones(16, 4) / 4)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch", type=int, default=48, help="global batch (default 48)")
    p.add_argument("--wrapper", choices=("ours", "torch"), default="ours")
    p.add_argument("--records", help="write the recovery's typed records to this JSONL file")
    p.add_argument(
        "--compute-ms", type=float, default=0.0, help="pretend each step computes this long"
    )
    args = p.parse_args()
    torch.manual_seed(0)
    torch.set_num_threads(1)
    net = nn.Sequential(nn.Linear(16, 64), nn.Tanh(), nn.Linear(64, 4))
    optim = torch.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(optim, step_size=50, gamma=0.5)
    out = open(args.records, "a") if args.records else None  # noqa: SIM115 (closed at the end)
    record = (lambda r: print(r.to_json(), file=out, flush=True)) if out else None  # optional

    def state_dict() -> dict:  # recovery: what a replica that joins receives
        return {"net": net.state_dict(), "optim": optim.state_dict(), "sched": sched.state_dict()}

    def load_state_dict(state: dict) -> None:  # recovery
        net.load_state_dict(state["net"])  # recovery
        optim.load_state_dict(state["optim"])  # recovery
        sched.load_state_dict(state["sched"])  # recovery

    manager = Manager(state_dict, load_state_dict, record=record)  # recovery
    if args.wrapper == "ours":
        from ddp.wrapper.distributed import DistributedDataParallel
    else:
        from torch.nn.parallel import DistributedDataParallel
    # recovery, a changed line: the wrapper on the manager's group, its gradients averaged over
    # the current quorum
    model = manager.wrap(DistributedDataParallel(net, process_group=manager.local_group))
    opt = manager.optimizer(optim)  # recovery
    while manager.step < args.steps:  # recovery, changed: the manager counts committed steps
        opt.zero_grad()
        x, y = batch(manager.step + 1, args.batch)
        s = manager.batch_slice(args.batch)  # recovery: this replica's share
        loss = F.mse_loss(model(x[s]), y[s])
        time.sleep(args.compute_ms / 1e3)
        loss.backward()
        if opt.step():  # False: the step failed in this quorum and is redone in the next
            sched.step()
    manager.close()  # recovery
    digest = hashlib.sha256(b"".join(t.detach().numpy().tobytes() for t in net.parameters()))
    print(json.dumps({"rank": manager.replica, "step": manager.step, "sha256": digest.hexdigest()}))
    if out:
        out.close()


if __name__ == "__main__":
    main()
