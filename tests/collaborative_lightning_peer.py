"""One peer running the three code blocks of hivemind's Lightning page (shared/seeds' "Training
on unreliable mixed GPUs"), with only their import lines changed (and ``accelerator="cpu"``:
no GPU here). Each block joins the Lighthouse in ``PL_INITIAL_PEERS`` (``addresses[i]``) and
trains ``steps`` batches; after every collaborative epoch the parameters go to
``<out>/<block>/<peer>/<epoch>.pt``."""

from __future__ import annotations

import os
import time

import torch

TARGET = 64


class _Saver:
    """Saves the parameters after every collaborative epoch; stops the fit after ``steps``
    batches (the seed's Trainer has no max_steps: Lightning's default is 1000 epochs)."""

    def __init__(self, folder, steps):
        self.folder, self.epoch, self.steps = folder, 0, steps
        os.makedirs(folder, exist_ok=True)

    def __call__(self, trainer):
        if trainer.global_step >= self.steps:
            trainer.should_stop = True
        collab = trainer.strategy.collaborative
        if collab is not None and collab.local_epoch != self.epoch:
            self.epoch = collab.local_epoch
            module = trainer.lightning_module
            params = {n: p.detach().clone() for n, p in module.named_parameters()}
            params["peers"] = collab.last_round["peers"]
            torch.save(params, os.path.join(self.folder, f"{self.epoch}.pt"))


def _meet(out, block, peer, limit=120.0):
    """Waits for the other peer to reach the same block (both then train side by side)."""
    open(os.path.join(out, f"ready{block}{peer}"), "w").close()
    deadline = time.monotonic() + limit
    while len([f for f in os.listdir(out) if f.startswith(f"ready{block}")]) < 2:
        assert time.monotonic() < deadline, f"the other peer never reached block {block}"
        time.sleep(0.02)


def _module(pl, saver):
    class Model(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Sequential(
                torch.nn.Linear(16, 256), torch.nn.Tanh(), torch.nn.Linear(256, 256),
                torch.nn.Tanh(), torch.nn.Linear(256, 1),
            )  # fmt: skip

        def training_step(self, batch, batch_idx):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def on_train_batch_end(self, outputs, batch, batch_idx):
            saver(self.trainer)

        def configure_optimizers(self):
            opt = torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)
            return [opt], [torch.optim.lr_scheduler.StepLR(opt, step_size=1, gamma=0.99)]

    return Model()


def _data(seed, steps):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(steps * 8, 16, generator=g)
    y = x[:, :1].sin()
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=8)


def run(out, peer, addresses, steps, seed):
    from functools import partial

    import pytorch_lightning as pl

    from torch_cgx.averaging import PowerSGDGradientAverager
    from torch_cgx.compression import (
        Float16Compression,
        SizeAdaptiveCompression,
        Uniform8BitQuantization,
    )
    from torch_cgx.lightning import HivemindStrategy

    os.chdir(out)  # Lightning writes lightning_logs/ (checkpoints) into the working directory
    target_batch_size = TARGET
    blocks = []
    # block 1
    blocks.append(lambda: pl.Trainer(
        strategy=HivemindStrategy(
            target_batch_size=target_batch_size,
            grad_compression=Float16Compression(),
            state_averaging_compression=Float16Compression(),
        ),
        accelerator="cpu",
        devices=1,
    ))  # fmt: skip
    # block 2
    compression = SizeAdaptiveCompression(
        threshold=2**16 + 1, less=Float16Compression(), greater_equal=Uniform8BitQuantization()
    )
    blocks.append(lambda: pl.Trainer(
        strategy=HivemindStrategy(
            target_batch_size=target_batch_size,
            grad_compression=compression,
            state_averaging_compression=compression,
        ),
        accelerator="cpu",
        devices=1,
    ))  # fmt: skip
    # block 3 (its target_batch_size=8192 made TARGET: this test trains a few hundred samples)
    blocks.append(lambda: pl.Trainer(
        strategy=HivemindStrategy(
            target_batch_size=TARGET,
            grad_averager_factory=partial(PowerSGDGradientAverager, averager_rank=32, min_compression_ratio=0.5),  # noqa: E501
        ),
        accelerator="cpu",
        devices=1,
    ))  # fmt: skip
    for i, make in enumerate(blocks):
        _meet(out, i, peer)
        os.environ["PL_INITIAL_PEERS"] = addresses[i]
        torch.manual_seed(seed)
        saver = _Saver(os.path.join(out, str(i), peer), steps)
        trainer = make()
        trainer.fit(_module(pl, saver), _data(seed, steps))
        assert trainer.strategy.collaborative is None  # torn down: left the collaboration
