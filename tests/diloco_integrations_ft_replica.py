"""One torchft replica group training through a DiLoCo integration with ``manager=``: one
process, its own torch.distributed world of one rank (``init_process_group("gloo")`` on a port
of its own) and a Manager to the test's Lighthouse (tests/torchft_replica.py builds it).

Run by tests/test_diloco_integrations_torchft.py.

:func:`accelerate`: ``AccelerateDiLoCo(..., manager=manager)``, AdamW inner steps, 4-bit
max-min every 4 steps; after every committed sync a snapshot ``<out>/<replica>/<manager
step>.pt`` (torchft_replica's, plus the loop's step and the inner optimizer's step count); at
manager step ``save_at`` the integration's state goes to ``<out>/ckpt`` (one folder for every
replica: the files are keyed by replica id); ``resume``: loaded from there first. ``kill_at``:
SIGKILL in the middle of that sync. Controls (files in ``out``): ``go``, ``stop`` as in
torchft_replica.

:func:`trainer`: ``attach_diloco(trainer, ..., manager=manager)``, 4 Trainer steps, DiLoCo every
2; the final parameters, global copies and metrics go to ``<out>/<replica>.pt``.
"""

from __future__ import annotations

import os
import socket

import torch
import torch.distributed as dist
import torchft_replica
from torchft_replica import HOST

TIMEOUT = 5.0  # the manager's and its process group's timeout (s)


def _own_world():
    """This replica group's torch.distributed world: one rank, a store on a port of its own."""
    socket.gethostname = lambda: HOST  # torchft's checkpoint server advertises the hostname
    os.environ["GLOO_SOCKET_IFNAME"] = "lo"
    store = dist.TCPStore(HOST, 0, 1, is_master=True, wait_for_workers=False)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    return store


def _save(obj, path: str) -> None:
    torch.save(obj, path + ".tmp")
    os.replace(path + ".tmp", path)


def _adam_steps(optimizer) -> float:
    state = optimizer.state_dict()["state"]
    return float(state[0]["step"]) if state else 0.0


def accelerate(out, lighthouse, replica, kill_at=0, save_at=0, resume=False) -> None:
    world = _own_world()
    from accelerate import Accelerator

    from torch_cgx.diloco import outer_sgd
    from torch_cgx.integrations import AccelerateDiLoCo

    if kill_at:
        torchft_replica._kill_in_the_middle_of(kill_at)
    accelerator = Accelerator(cpu=True)
    assert dist.get_world_size() == 1, dist.get_world_size()
    model, target, data, _ = torchft_replica._replica(replica, kill_at + 100 * resume)
    model, inner = accelerator.prepare(model, torch.optim.AdamW(model.parameters(), lr=0.003))
    manager, _store = torchft_replica._manager(lighthouse, replica, TIMEOUT)
    mine, ckpt = os.path.join(out, replica), os.path.join(out, "ckpt")
    os.makedirs(mine, exist_ok=True)
    # (outer momentum 0.5: with the default 0.9 the held-out loss of this model oscillates)
    outer = lambda p: outer_sgd(p, momentum=0.5)  # noqa: E731
    options = {"compressor_params": {"bits": 4}, "manager": manager, "outer_optimizer": outer}
    with AccelerateDiLoCo(accelerator, model, inner, sync_every=4, **options) as dl:
        if resume:
            dl.load_state(ckpt)
        _save({"loop_step": dl.session.loop_step, "adam": _adam_steps(inner)},
              os.path.join(mine, f"up.{os.getpid()}"))  # fmt: skip
        torchft_replica._wait_for(os.path.join(out, "go"), 120)
        committed = manager.current_step()
        while True:
            x = torch.randn(32, 16, generator=data)
            with torch.no_grad():
                y = target(x)
            accelerator.backward(torch.nn.functional.mse_loss(model(x), y))
            inner.step()
            inner.zero_grad()
            dl.step()
            if manager.current_step() != committed and dl.diloco.schedule.applies_at(
                dl.session.step
            ):
                committed = manager.current_step()
                snap = torchft_replica._snapshot(dl.diloco, model, target)
                snap.update(loop_step=dl.session.loop_step, adam=_adam_steps(inner),
                            metrics=dl.metrics())  # fmt: skip
                _save(snap, os.path.join(mine, f"{committed}.pt"))
                if committed == save_at:
                    dl.save_state(ckpt)
                stop = torchft_replica._stop_step(out)
                if stop is not None and committed >= stop:
                    break
    manager.shutdown(wait=False)
    dist.destroy_process_group()
    del world


class _Regression(torch.nn.Module):
    """A model Trainer can train: ``forward(x, labels)`` returns the loss."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)  # the same start on every replica (init_sync=False)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)
        )

    def forward(self, x, labels=None):
        out = self.net(x)
        return {"loss": torch.nn.functional.mse_loss(out, labels), "logits": out}


def trainer(out, lighthouse, replica) -> None:
    world = _own_world()
    from transformers import Trainer, TrainingArguments

    from torch_cgx.integrations import attach_diloco

    manager, _store = torchft_replica._manager(lighthouse, replica, TIMEOUT)
    g = torch.Generator().manual_seed(int(replica[1:]) + 1)  # each replica its own data
    x = torch.randn(64, 16, generator=g)
    data = [{"x": a, "labels": a[:1].sin()} for a in x]
    args = TrainingArguments(output_dir=os.path.join(out, replica), per_device_train_batch_size=8,
                             max_steps=4, use_cpu=True, report_to=[], save_strategy="steps",
                             save_steps=2, logging_steps=2, disable_tqdm=True, seed=0,
                             learning_rate=0.01)  # fmt: skip
    model = _Regression()
    trainer = Trainer(model=model, args=args, train_dataset=data)
    cb = attach_diloco(trainer, sync_every=2, compressor_params={"bits": 4}, manager=manager)
    seen = []

    from transformers import TrainerCallback

    class Watch(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            seen.append(torch.cat([p.detach().flatten() for p in model.parameters()]))

    trainer.add_callback(Watch())
    trainer.train()
    files = sorted(os.listdir(os.path.join(out, replica, "checkpoint-2")))
    _save({"seen": seen, "globals": cb.session.diloco.global_parameters(),
           "metrics": cb.session.metrics(), "files": files,
           "wrapped": type(trainer.model_wrapped).__name__},
          os.path.join(out, f"{replica}.pt"))  # fmt: skip
    manager.shutdown(wait=False)
    dist.destroy_process_group()
    del world
