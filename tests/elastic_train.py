"""A DDP training under torchrun that checkpoints every step (model, optimizer, and the
compression hook's state with its error-feedback residuals) and resumes from the newest
checkpoint that every rank has; tests/test_faults.py kills one rank mid-run and lets
`torchrun --max-restarts 1` restart it.

    torchrun --nproc-per-node 2 --max-restarts 1 tests/elastic_train.py DIR [--kill-at N]
"""

from __future__ import annotations

import argparse
import glob
import os
import signal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

STEPS = 10


class Net(torch.nn.Module):
    """Layers registered last-used first, so that DDP's initial bucket (what a restarted DDP
    starts from) lays the layers out as its rebuilt one does: the compressed concatenation is the
    same before and after a restart (docs/hooks.md; tests/test_resume.py)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.out = torch.nn.Linear(128, 10)
        self.inp = torch.nn.Linear(64, 128)

    def forward(self, x):
        return self.out(torch.relu(self.inp(x)))


def newest_common_step(ckpt_dir: str, rank: int) -> int:
    """The newest step whose checkpoint every rank has written (-1: none)."""
    mine = [int(p.split("-")[-1][:-3]) for p in glob.glob(f"{ckpt_dir}/r{rank}-*.pt")]
    t = torch.tensor([max(mine, default=-1)])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t)


def save(ckpt_dir: str, rank: int, step: int, model, opt, state) -> None:
    blob = {"model": model.state_dict(), "opt": opt.state_dict(), "hook": state}
    tmp = f"{ckpt_dir}/r{rank}-{step}.tmp"
    torch.save(blob, tmp)
    os.replace(tmp, f"{ckpt_dir}/r{rank}-{step}.pt")  # never a half-written checkpoint
    for old in glob.glob(f"{ckpt_dir}/r{rank}-*.pt"):
        if int(old.split("-")[-1][:-3]) < step - 1:  # keep two: the ranks may be one apart
            os.remove(old)


def main() -> None:
    from torch_cgx import hooks

    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--kill-at", type=int, default=-1)
    args = p.parse_args()
    dist.init_process_group("cgx")
    rank = dist.get_rank()
    model = Net()
    ddp = DDP(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    state = hooks.CompressionState(compressor="maxmin", params={"bits": 2, "bucket_size": 64},
                                   error_feedback=True, layer_min_size=256,
                                   module=model)  # fmt: skip
    start = newest_common_step(args.dir, rank) + 1
    if start > 0:  # the hook state comes back whole (residuals keyed by parameter name)
        blob = torch.load(f"{args.dir}/r{rank}-{start - 1}.pt", weights_only=True)
        model.load_state_dict(blob["model"])
        opt.load_state_dict(blob["opt"])
        state = blob["hook"]
        state.attach(model)
        residual = sum(float(v.norm()) for v in state.residuals.values())
        with open(f"{args.dir}/resumed-{rank}.txt", "w") as f:
            f.write(f"{start} {residual}\n")
    ddp.register_comm_hook(state, hooks.compression_hook)
    for step in range(start, STEPS):
        marker = f"{args.dir}/killed"
        if step == args.kill_at and rank == 1 and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()
        save(args.dir, rank, step, model, opt, state)
    if rank == 0:
        torch.save(model.state_dict(), f"{args.dir}/final.pt")
    del ddp
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
