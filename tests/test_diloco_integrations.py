"""DiLoCo in transformers' Trainer, a bare accelerate loop and Lightning
(torch_cgx.integrations.diloco_*), on 2 real ranks: one pair of processes serves every case
(imports dominate the time). Each case trains with max-min 4-bit pseudo-gradients, checks that the
replicas differ between syncs (no per-step gradient allreduce across workers) and are bitwise
identical after each sync, and that a run resumed from a checkpoint taken mid-period ends bitwise
equal to the uninterrupted run on every rank."""

from __future__ import annotations

import importlib.util
import os
import shutil
import types

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks

NEEDED = ("transformers", "accelerate", "lightning")
pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in NEEDED),
    reason="transformers, accelerate and lightning are needed (requirements-dev.txt)",
)
ELASTIC = {"TORCHELASTIC_RUN_ID": "cgx-test", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0"}
BITS4 = {"bits": 4}


def flat(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def replicas_equal(model) -> bool:
    mine = flat(model)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    return all(torch.equal(out[0], o) for o in out[1:])


def check_pattern(seen, sync_every, what):
    """``seen``: (step, replicas equal) after each step: equal exactly at the sync steps."""
    expected = [(s, s % sync_every == 0) for s, _ in seen]
    assert seen == expected, f"{what}: replicas equal only after syncs, got {seen}"


# --- transformers' Trainer -----------------------------------------------------------------------


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=32,
                        bos_token_id=0, eos_token_id=0)  # fmt: skip
    return GPT2LMHeadModel(config)


def counting_tokens(n=128, seq=32):
    """Sequences counting up from a random start: learnable in a few steps."""
    start = torch.randint(0, 256, (n, 1), generator=torch.Generator().manual_seed(1))
    ids = (start + torch.arange(seq)) % 256
    return [{"input_ids": r, "labels": r} for r in ids]


def trainer_for(out, steps, **kw):
    from transformers import Trainer, TrainingArguments

    kw = {"save_strategy": "no", "learning_rate": 3e-3, **kw}
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=steps,
                             use_cpu=True, report_to=[], logging_steps=2, disable_tqdm=True,
                             seed=0, **kw)  # fmt: skip
    return Trainer(model=tiny_gpt2(), args=args, train_dataset=counting_tokens())


def watch(trainer, cb):
    """A callback after the DiLoCo one: (step, replicas equal) after every step, and that
    DiLoCo's step is Trainer's."""
    from transformers import TrainerCallback

    seen = []

    class Watch(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            assert cb.session.step == state.global_step
            seen.append((state.global_step, replicas_equal(trainer.model)))

    trainer.add_callback(Watch())
    return seen


def trainer_run(out, resume=None, steps=8):
    """DiLoCo every 2 steps, each reduction started one step before it is applied, gradient
    accumulation over 2 batches, checkpoints every 3 steps (step 3: mid-period, a reduction in
    flight)."""
    from torch_cgx.integrations import attach_diloco

    trainer = trainer_for(out, steps, save_strategy="steps", save_steps=3,
                          gradient_accumulation_steps=2)  # fmt: skip
    cb = attach_diloco(trainer, sync_every=2, compressor_params=BITS4, fragment_sync_delay=1)
    assert trainer.callback_handler.callbacks[0] is cb
    seen = watch(trainer, cb)
    trainer.train(resume_from_checkpoint=resume)
    return trainer, cb, seen


def trainer_case(out):
    trainer, cb, seen = trainer_run(out)
    check_pattern(seen, 2, "Trainer")
    m = cb.session.metrics()
    assert m["diloco/syncs"] == 4 and cb.session.started == 4, m  # steps 2, 4, 6, 8
    fp32 = 4 * sum(p.numel() for p in trainer.model.parameters())
    assert 0 < m["diloco/bytes_per_sync"] < fp32 / 6, (m, fp32)  # 4-bit
    logged = [h for h in trainer.state.log_history if "diloco/syncs" in h and "loss" in h]
    assert [h["diloco/syncs"] for h in logged] == [1, 2, 3, 4], logged
    losses = [h["loss"] for h in logged]  # it trains: 5.33, 5.14, 5.04, 4.94 when written
    assert losses == sorted(losses, reverse=True) and losses[-1] < 0.95 * losses[0], losses
    final = flat(trainer.model)
    ckpt = os.path.join(out, "checkpoint-3")
    assert os.path.isfile(os.path.join(ckpt, f"diloco-rank{dist.get_rank()}.pt"))

    resumed, cb2, seen2 = trainer_run(out, resume=ckpt)
    check_pattern(seen2, 2, "resumed Trainer")
    assert [s for s, _ in seen2] == [4, 5, 6, 7, 8]
    assert torch.equal(flat(resumed.model), final), "the resumed run differs"
    assert cb2.session.metrics()["diloco/bytes_sent"] == m["diloco/bytes_sent"]
    g1, g2 = cb.session.diloco.global_parameters(), cb2.session.diloco.global_parameters()
    assert all(torch.equal(g1[k], g2[k]) for k in g1)

    # Without this rank's DiLoCo state a resume cannot continue: a clear error, not a silent
    # restart from rank 0's replica.
    bare = os.path.join(out, "bare")
    if dist.get_rank() == 0:
        shutil.copytree(ckpt, os.path.join(bare, "checkpoint-3"))
        for r in range(dist.get_world_size()):
            os.remove(os.path.join(bare, "checkpoint-3", f"diloco-rank{r}.pt"))
    dist.barrier()
    with pytest.raises(ValueError, match="without this rank's DiLoCo state"):
        trainer_run(bare, resume=os.path.join(bare, "checkpoint-3"))


def hierarchical_case(out):
    """ranks_per_node=2: Trainer's DDP on the node group (both ranks) averages every step;
    DiLoCo runs across nodes (here one node: groups of one rank)."""
    from torch_cgx.integrations import attach_diloco

    trainer = trainer_for(out, 3)
    cb = attach_diloco(trainer, sync_every=2, compressor_params=BITS4, ranks_per_node=2)
    seen = watch(trainer, cb)
    trainer.train()
    assert seen == [(1, True), (2, True), (3, True)], seen
    ddp = trainer.model_wrapped
    assert isinstance(ddp, torch.nn.parallel.DistributedDataParallel)
    assert ddp.process_group.size() == 2 and ddp.process_group is not dist.group.WORLD
    assert cb.session.diloco.group.size() == 1 and cb.session.metrics()["diloco/syncs"] == 2


def bad_trainer_combinations(out):
    from torch_cgx.integrations import attach, attach_diloco

    args = types.SimpleNamespace(deepspeed="ds_config.json", fsdp=[])  # not installed here
    fake = types.SimpleNamespace(is_deepspeed_enabled=True, is_fsdp_enabled=False, args=args)
    with pytest.raises(ValueError, match="DeepSpeed or FSDP"):
        attach_diloco(fake, sync_every=2)
    fsdp = trainer_for(out, 1, fsdp="full_shard")
    with pytest.raises(ValueError, match="DeepSpeed or FSDP"):
        attach_diloco(fsdp, sync_every=2)
    with pytest.raises(ValueError, match="sync_every must be an integer >= 1"):
        attach_diloco(trainer_for(out, 1), sync_every=0)
    hooked = trainer_for(out, 1)
    attach(hooked, hook="powersgd")
    with pytest.raises(ValueError, match="do not combine"):
        attach_diloco(hooked, sync_every=2)


# --- accelerate -----------------------------------------------------------------------------------


def accelerate_run(accelerator, out, rank, save_at=None, load=False, steps=6):
    """Gradient accumulation over 2 batches, DiLoCo every 3 optimizer steps."""
    from torch_cgx.integrations import AccelerateDiLoCo

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 4))
    model, opt = accelerator.prepare(net, torch.optim.AdamW(net.parameters(), lr=0.01))
    g = torch.Generator().manual_seed(rank)
    batches = [torch.randn(8, 16, generator=g) for _ in range(2 * steps)]
    seen = []
    with AccelerateDiLoCo(accelerator, model, opt, sync_every=3, compressor_params=BITS4) as dl:
        if load:
            dl.load_state(out)
        for x in batches[2 * dl.session.step :]:
            with accelerator.accumulate(model):
                accelerator.backward(torch.nn.functional.mse_loss(model(x), torch.tanh(x[:, :4])))
                opt.step()
                opt.zero_grad()
                dl.step()
            if accelerator.sync_gradients:
                seen.append((dl.session.step, replicas_equal(model)))
                if dl.session.step == save_at:
                    dl.save_state(out)
    return model, dl, seen


def accelerate_case(out):
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=True, gradient_accumulation_steps=2)
    rank = dist.get_rank()
    model, dl, seen = accelerate_run(accelerator, out, rank, save_at=4)
    check_pattern(seen, 3, "accelerate")
    assert [s for s, _ in seen] == [1, 2, 3, 4, 5, 6] and dl.metrics()["diloco/syncs"] == 2
    resumed, _, seen2 = accelerate_run(accelerator, out, rank, load=True)
    assert seen2 == [(5, False), (6, True)], seen2
    assert torch.equal(flat(resumed), flat(model)), "the resumed accelerate run differs"
    from accelerate.utils import DistributedType

    from torch_cgx.integrations import AccelerateDiLoCo

    fake = types.SimpleNamespace(distributed_type=DistributedType.DEEPSPEED)
    with pytest.raises(ValueError, match="not on accelerate's DEEPSPEED"):
        AccelerateDiLoCo(fake, model, sync_every=3)
    with pytest.raises(ValueError, match="sync_every must be an integer >= 1"):
        AccelerateDiLoCo(accelerator, model, sync_every=0)
    with pytest.raises(ValueError, match="needs DDP on the node group"):
        AccelerateDiLoCo(accelerator, model, sync_every=3, ranks_per_node=2)
    accelerate_fragments_case(accelerator)
    accelerate_node_case(accelerator)


def accelerate_fragments_case(accelerator):
    """Streaming DiLoCo through ``fragments``: two fragments, each synced every 4 steps at
    staggered steps (2 and 4); every trainable parameter must be in one."""
    from torch_cgx.integrations import AccelerateDiLoCo

    net = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))
    model, opt = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    with pytest.raises(ValueError, match="leaves out trainable parameters"):
        AccelerateDiLoCo(accelerator, model, opt, sync_every=4, fragments=lambda m: [m[0]])
    seen, g = [], torch.Generator().manual_seed(dist.get_rank())
    two = lambda m: [m[0], m[2]]  # noqa: E731
    with AccelerateDiLoCo(accelerator, model, opt, sync_every=4, fragments=two) as dl:
        for _ in range(8):  # 4 optimizer steps
            with accelerator.accumulate(model):
                accelerator.backward(model(torch.randn(4, 16, generator=g)).square().mean())
                opt.step()
                opt.zero_grad()
                dl.step()
            if accelerator.sync_gradients:
                seen.append([replicas_equal(model.module[i]) for i in (0, 2)])
    assert seen == [[False, False], [True, False], [False, False], [False, True]], seen
    assert dl.metrics()["diloco/syncs"] == 2 + 2  # two in the schedule, two at the end


def accelerate_node_case(accelerator):
    """node_ddp before prepare: DDP on the node group (both ranks) averages every step."""
    from torch_cgx.integrations import AccelerateDiLoCo, node_ddp

    inner, _ = node_ddp(accelerator, 2)
    net = torch.nn.Linear(16, 4)
    model, opt = accelerator.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    assert model.process_group is inner
    seen, g = [], torch.Generator().manual_seed(dist.get_rank())  # each rank its own data
    with AccelerateDiLoCo(accelerator, model, opt, sync_every=2, ranks_per_node=2) as dl:
        for _ in range(6):  # 3 optimizer steps (accumulation over 2 batches)
            with accelerator.accumulate(model):
                accelerator.backward(model(torch.randn(4, 16, generator=g)).square().mean())
                opt.step()
                opt.zero_grad()
                dl.step()
            if accelerator.sync_gradients:
                seen.append((dl.session.step, replicas_equal(model)))
    assert seen == [(1, True), (2, True), (3, True)], seen


# --- Lightning ------------------------------------------------------------------------------------


def lightning_fit(L, out, ckpt=None, **options):
    """One batch per rank and epoch (a plain DataLoader resumed mid-epoch restarts its epoch in
    Lightning), a checkpoint after every epoch, DiLoCo every 3 steps."""
    from torch_cgx.integrations.diloco_lightning import DiLoCoStrategy

    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(),
                                           torch.nn.Linear(32, 4))  # fmt: skip
            self.seen = []

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def on_train_batch_end(self, *args):
            self.seen.append((self.trainer.global_step, replicas_equal(self)))

        def on_train_start(self):  # DDP wraps the module during fit only
            self.ddp_on_world = self.trainer.strategy.model.process_group is dist.group.WORLD

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=0.01)

    class Memory(L.loggers.logger.Logger):
        name, version = "memory", 0
        log_hyperparams = staticmethod(lambda *a, **k: None)

        def __init__(self):
            super().__init__()
            self.rows = []

        def log_metrics(self, metrics, step=None):
            self.rows.append((step, dict(metrics)))

    x = torch.randn(16, 16, generator=torch.Generator().manual_seed(1))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, torch.tanh(x[:, :4])),
                                       batch_size=8)  # fmt: skip
    strategy = DiLoCoStrategy(sync_every=3, compressor_params=BITS4, **options)
    keep = L.callbacks.ModelCheckpoint(dirpath=out, save_top_k=-1, every_n_epochs=1)
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=8,
                        logger=Memory(), log_every_n_steps=2, callbacks=[keep],
                        enable_progress_bar=False, enable_model_summary=False)  # fmt: skip
    module = Regression()
    trainer.fit(module, data, ckpt_path=ckpt)
    return trainer, module, strategy


def lightning_case(out):
    import lightning.pytorch as L

    from torch_cgx.integrations.diloco_lightning import DiLoCoStrategy, rank_file

    trainer, module, strategy = lightning_fit(L, out)
    # step 8 is not a sync step: the replicas differ there, until final_sync at the end
    check_pattern(module.seen, 3, "Lightning")
    assert replicas_equal(module) and strategy.session.metrics()["diloco/syncs"] == 3
    if dist.get_rank() == 0:
        rows = [m for _, m in trainer.logger.rows if "diloco/syncs" in m]
        assert [r["diloco/step"] for r in rows] == [2, 4, 6, 8], rows
        assert rows[-1]["diloco/syncs"] == 2 and rows[-1]["diloco/bytes_per_sync"] > 0
    ckpt = os.path.join(out, "epoch=3-step=4.ckpt")
    assert os.path.isfile(rank_file(ckpt, dist.get_rank()))
    _, resumed, _ = lightning_fit(L, out, ckpt)
    assert [s for s, _ in resumed.seen] == [5, 6, 7, 8]
    assert torch.equal(flat(resumed), flat(module)), "the resumed Lightning run differs"
    _, node, _ = lightning_fit(L, os.path.join(out, "node"), ranks_per_node=2)
    assert node.seen == [(s, True) for s in range(1, 9)], node.seen  # DDP inside the node
    assert module.ddp_on_world and not node.ddp_on_world  # on the node group
    with pytest.raises(ValueError, match="sync_every must be an integer >= 1"):
        DiLoCoStrategy(sync_every=0)
    with pytest.raises(ValueError, match="ddp_comm_hook is not taken"):
        DiLoCoStrategy(sync_every=2, ddp_comm_hook=lambda s, b: None)


def body(rank, world, out):
    trainer_case(os.path.join(out, "trainer"))
    hierarchical_case(os.path.join(out, "hierarchical"))
    bad_trainer_combinations(os.path.join(out, "bad"))
    accelerate_case(os.path.join(out, "accelerate"))
    lightning_case(os.path.join(out, "lightning"))
    dist.destroy_process_group()


def test_diloco_in_trainer_accelerate_and_lightning(tmp_path):
    run_ranks(body, 2, str(tmp_path), env=ELASTIC, timeout=300)


def test_bad_options_are_value_errors():
    from torch_cgx.integrations.diloco import Options

    with pytest.raises(ValueError, match="sync_every must be an integer >= 1"):
        Options(0)
    with pytest.raises(ValueError, match="fragment_sync_delay"):
        Options(4, fragment_sync_delay=4)
    with pytest.raises(ValueError, match="unknown compressor"):
        Options(4, compressor="nope")
    with pytest.raises(ValueError, match="ranks_per_node"):
        Options(4, ranks_per_node=0)
    with pytest.raises(ValueError, match="group is set by the integration"):
        Options(4, group=None)
