"""CGXStrategy: Lightning's DDP on the cgx backend with a torch_cgx hook. Two ranks are started
as torchrun would (TORCHELASTIC_RUN_ID, RANK, LOCAL_RANK, WORLD_SIZE...), so Lightning detects
TorchElasticEnvironment and launches nothing itself: the run has a bounded time."""

from __future__ import annotations

import copy
import importlib
import importlib.util

import exact_reference as ref
import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks

PACKAGES = {"lightning": "lightning.pytorch", "pytorch_lightning": "pytorch_lightning"}
ELASTIC = {"TORCHELASTIC_RUN_ID": "cgx-test", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0"}


def installed(package):
    return pytest.mark.skipif(importlib.util.find_spec(package) is None,
                              reason=f"{package} is not installed")  # fmt: skip


def make_module(L):
    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                           torch.nn.Linear(64, 4))  # fmt: skip
            self.losses = []

        def training_step(self, batch, _):
            if not hasattr(self, "first_batch"):
                self.first_batch = batch
            x, y = batch
            loss = torch.nn.functional.mse_loss(self.net(x), y)
            self.losses.append(loss.item())
            return loss

        def on_train_start(self):  # DDP wraps the module during fit only
            self.hooks = [
                (h.__name__, state) for h, state in self.trainer.strategy.model._comm_hooks
            ]

        def on_train_batch_end(self, outputs, batch, batch_idx):
            if not hasattr(self, "first_net"):  # after the first optimizer step
                self.first_net = copy.deepcopy(self.net)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    return Regression()


def data():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(512, 32, generator=g)
    y = torch.tanh(x[:, :4] * 2) + 0.5 * x[:, 4:8]  # learnable, the same on every rank
    return torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, y), batch_size=16)


def fit(L, strategy, steps):
    module = make_module(L)
    trainer = L.Trainer(accelerator="cpu", devices=2, num_nodes=1, strategy=strategy,
                        max_steps=steps, logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    trainer.fit(module, data())
    return trainer, module


def grad_compressions(C, hooks):
    """(grad_compression, compression_params, expected hook name) of each run."""
    return [
        ("maxmin", {"bits": 4, "bucket_size": 128}, "compression_hook"),
        (
            C.SizeAdaptiveCompression(1024, C.NoCompression(), C.Uniform8BitQuantization()),
            None,
            "policy_hook",
        ),  # fmt: skip
        (hooks.CGXState(None, compression_params={"bits": 8}), None, "cgx_hook"),
    ]


def body_fit(rank, world, runs):
    from torch_cgx import compression as C
    from torch_cgx import hooks
    from torch_cgx.lightning import strategy_class

    steps = 12
    for package, kinds in runs:  # one process group (cgx) serves every fit
        L = importlib.import_module(PACKAGES[package])
        for grad_compression, params, hook_name in kinds(grad_compressions(C, hooks)):
            strategy = strategy_class(package)(grad_compression, params)
            assert isinstance(strategy, L.strategies.DDPStrategy)
            trainer, module = fit(L, strategy, steps)
            assert dist.get_backend() == "cgx"
            assert [name for name, _ in module.hooks] == [hook_name]
            assert module.hooks[0][1] is trainer.strategy.hook_state
            if hook_name == "compression_hook":
                assert trainer.strategy.hook_state.steps == steps  # it ran at every step
            if hook_name == "policy_hook":
                assert all(s.steps == steps for s in trainer.strategy.hook_state.states.values())
            if hook_name == "cgx_hook":  # the first SGD step against an exact run
                x, y = module.first_batch
                loss = lambda m, x=x, y=y: torch.nn.functional.mse_loss(m(x), y)  # noqa: E731
                ref.check_first_step(f"{package} + cgx_hook (8 bits)", make_module(L).net,
                                     module.first_net, 0.1, loss, 8)  # fmt: skip
            first, last = module.losses[:3], module.losses[-3:]
            assert sum(last) < 0.8 * sum(first), (package, hook_name, module.losses)
            gloo = dist.new_group(backend="gloo")
            for p in module.parameters():  # bit-identical replicas
                out = [torch.empty_like(p) for _ in range(world)]
                dist.all_gather(out, p.detach(), group=gloo)
                assert torch.equal(out[0], out[1]), (package, hook_name)


def all_kinds(kinds):
    return kinds


def policy_kind(kinds):
    return kinds[1:2]


def test_two_ranks_train_with_each_kind_of_grad_compression():
    """lightning.pytorch with a compressor name, a policy and a CGXState, then
    pytorch_lightning with a policy, in the same two processes (imports dominate the time)."""
    runs = [(p, k) for p, k in (("lightning", all_kinds), ("pytorch_lightning", policy_kind))
            if importlib.util.find_spec(p) is not None]  # fmt: skip
    if not runs:
        pytest.skip("neither lightning nor pytorch_lightning is installed")
    run_ranks(body_fit, 2, runs, env=ELASTIC, timeout=240)


@installed("lightning")
def test_bad_grad_compression_is_a_clear_value_error():
    from torch_cgx import compression as C
    from torch_cgx.hooks import PowerSGDState
    from torch_cgx.lightning import CGXStrategy

    assert CGXStrategy().process_group_backend == "cgx"
    with pytest.raises(ValueError, match="unknown compressor 'nope'"):
        CGXStrategy(grad_compression="nope")
    with pytest.raises(ValueError, match="bits"):
        CGXStrategy(grad_compression="maxmin", compression_params={"bits": 9})
    with pytest.raises(ValueError, match="grad_compression must be None, a compressor name"):
        CGXStrategy(grad_compression=4)
    with pytest.raises(ValueError, match="no compressed allreduce"):
        CGXStrategy(grad_compression=C.Quantile8BitQuantization())
    with pytest.raises(ValueError, match="compression_params goes with a compressor name"):
        CGXStrategy(grad_compression=C.NoCompression(), compression_params={"bits": 4})
    with pytest.raises(ValueError, match="runs on the cgx backend"):
        CGXStrategy(grad_compression="fp16", process_group_backend="gloo")
    with pytest.raises(ValueError, match="not both"):
        CGXStrategy(grad_compression="fp16", ddp_comm_hook=lambda s, b: None)
    CGXStrategy(grad_compression=PowerSGDState(None), process_group_backend="gloo")  # any group
    with pytest.raises(ValueError, match="package must be"):
        from torch_cgx.lightning import strategy_class

        strategy_class("keras")
