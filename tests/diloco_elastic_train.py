"""A DiLoCo training under torchrun that checkpoints every inner step (model, inner optimizer and
``DiLoCo.state_dict()``: outer optimizers, global copies, error-feedback residuals, step, a
finished reduction not yet applied) and resumes from the newest step every rank has;
tests/test_diloco_elastic.py kills rank 1 mid-run and lets ``torchrun --max-restarts`` restart
the job, then compares with an uninterrupted run.

    torchrun --nproc-per-node 2 --max-restarts 2 tests/diloco_elastic_train.py DIR \\
        [--streaming] [--kill-at N ...]

DiLoCo: one fragment, ``sync_every=3``; ``--streaming``: two fragments, ``sync_every=4``,
``fragment_sync_delay=1`` (fragment 0's reduction starts after inner steps 1, 5, 9 and is applied
after 2, 6, 10; fragment 1's 3, 7, 11 / 4, 8). Both average over the default (cgx) group
with max-min at 4 bits and error feedback. Inner steps count from 1; ``--kill-at N`` makes rank
1 SIGKILL itself right after inner step N (a reduction that step started is on the wire),
before its checkpoint N, on the first attempt only (a marker file per N); give it several times
for several kills (then ``--max-restarts`` must be at least their number).

Writes ``DIR/final-{rank}.pt``: the local parameters after the last inner step (they differ
between ranks), the parameters after a closing ``sync_now()`` (the same on every rank), and the
DiLoCo state; and ``DIR/resumed-{rank}-{start}.txt`` at each resume (the first inner step run,
whether a finished reduction came back from the checkpoint, the residuals' norm).
"""

from __future__ import annotations

import argparse
import glob
import os
import signal

import torch
import torch.distributed as dist

STEPS = 11  # DiLoCo ends two steps after a sync; Streaming with a reduction in flight


def make_model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(16, 48), torch.nn.Tanh(), torch.nn.Linear(48, 4))


def make_diloco(model, inner, streaming: bool):
    from torch_cgx.diloco import DiLoCo

    frags = [model[0], model[2]] if streaming else model
    every, delay = (4, 1) if streaming else (3, 0)
    return DiLoCo(frags, inner, sync_every=every, compressor="maxmin",
                  compressor_params={"bits": 4}, error_feedback=True,
                  fragment_sync_delay=delay)  # fmt: skip


def batch(step: int, rank: int):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)


def steps_saved(ckpt_dir: str, rank: int) -> list:
    return [int(p.split("-")[-1][:-3]) for p in glob.glob(f"{ckpt_dir}/r{rank}-*.pt")]


def newest_common_step(ckpt_dir: str, rank: int) -> int:
    """The newest inner step whose checkpoint every rank has written (0: none)."""
    t = torch.tensor([max(steps_saved(ckpt_dir, rank), default=0)])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return int(t)


def save(ckpt_dir: str, rank: int, step: int, model, inner, diloco, keep: int) -> None:
    blob = {"model": model.state_dict(), "inner": inner.state_dict(),
            "diloco": diloco.state_dict()}  # fmt: skip
    tmp = f"{ckpt_dir}/r{rank}-{step}.tmp"
    torch.save(blob, tmp)
    os.replace(tmp, f"{ckpt_dir}/r{rank}-{step}.pt")  # never a half-written checkpoint
    # a rank runs ahead of a dead peer until its next collective, at most `keep` steps
    for old in steps_saved(ckpt_dir, rank):
        if old < step - keep:
            os.remove(f"{ckpt_dir}/r{rank}-{old}.pt")


def resume(ckpt_dir: str, rank: int, model, inner, diloco) -> int:
    """Loads the newest common checkpoint (after constructing the DiLoCo: its constructor
    broadcasts rank 0's parameters); returns the first inner step to run."""
    last = newest_common_step(ckpt_dir, rank)
    if last == 0:
        return 1
    blob = torch.load(f"{ckpt_dir}/r{rank}-{last}.pt", weights_only=True)
    model.load_state_dict(blob["model"])
    inner.load_state_dict(blob["inner"])
    diloco.load_state_dict(blob["diloco"])
    assert diloco.step == last, (diloco.step, last)
    pending = any(f["pending"] is not None for f in blob["diloco"]["fragments"])
    residual = sum(
        float(r.norm()) for f in blob["diloco"]["fragments"] for r in f["residuals"].values()
    )
    with open(f"{ckpt_dir}/resumed-{rank}-{last + 1}.txt", "w") as f:
        f.write(f"{last + 1} {int(pending)} {residual}\n")
    return last + 1


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("dir")
    p.add_argument("--streaming", action="store_true")
    p.add_argument("--kill-at", type=int, action="append", default=[])
    args = p.parse_args()
    import torch_cgx  # noqa: F401  (registers the cgx backend)

    dist.init_process_group("cgx")
    rank = dist.get_rank()
    model = make_model()
    inner = torch.optim.AdamW(model.parameters(), lr=0.01)
    diloco = make_diloco(model, inner, args.streaming)
    start = resume(args.dir, rank, model, inner, diloco)
    with diloco:
        for step in range(start, STEPS + 1):
            x, y = batch(step, rank)
            inner.zero_grad()
            torch.nn.functional.mse_loss(model(x), y).backward()
            inner.step()  # DiLoCo's hook: a reduction may start and / or be applied here
            marker = f"{args.dir}/killed-{step}"
            if step in args.kill_at and rank == 1 and not os.path.exists(marker):
                open(marker, "w").close()
                os.kill(os.getpid(), signal.SIGKILL)
            save(args.dir, rank, step, model, inner, diloco, diloco.schedule.sync_every)
    local = {k: v.clone() for k, v in model.state_dict().items()}
    diloco.sync_now()
    blob = {"local": local, "final": model.state_dict(), "diloco": diloco.state_dict()}
    torch.save(blob, f"{args.dir}/final-{rank}.pt")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
