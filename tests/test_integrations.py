"""transformers' Trainer on torch_cgx (torch_cgx.integrations): a tiny GPT-2 built from a config
(no download) on random tokens, 2 real ranks (torchrun's variables, Gloo rendezvous on
127.0.0.1). One pair of processes serves every cgx case (importing transformers dominates the
time): the backend at 4 bits, a hook through the callback, resume from a Trainer checkpoint,
and the "nothing compressed" checks; a second pair lets Trainer create a Gloo group."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import warnings

import exact_reference as ref
import pytest
import torch
import torch.distributed as dist
from dist_helpers import free_port, run_ranks

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("transformers") is None
    or importlib.util.find_spec("accelerate") is None,
    reason="transformers and accelerate are needed (requirements-dev.txt)",
)

STEPS = 6


def tiny_gpt2():
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=2, vocab_size=256, n_positions=32,
                        bos_token_id=0, eos_token_id=0)  # fmt: skip
    return GPT2LMHeadModel(config)


def tokens(n=96, seq=32):
    ids = torch.randint(0, 256, (n, seq), generator=torch.Generator().manual_seed(1))
    return [{"input_ids": r, "labels": r} for r in ids]


def trainer_for(out, steps=STEPS, callbacks=(), model=None, **kw):
    from transformers import Trainer, TrainingArguments

    kw = {"save_strategy": "no", "learning_rate": 1e-3, **kw}
    args = TrainingArguments(output_dir=out, per_device_train_batch_size=4, max_steps=steps,
                             use_cpu=True, report_to=[], logging_steps=2, disable_tqdm=True,
                             seed=0, **kw)  # fmt: skip
    model = tiny_gpt2() if model is None else model
    return Trainer(model=model, args=args, train_dataset=tokens(), callbacks=list(callbacks))


def ours(record):
    from torch_cgx.warn import NothingCompressedWarning

    return [w for w in record if issubclass(w.category, NothingCompressedWarning)]


def flat_params(model):
    return torch.cat([p.detach().flatten() for p in model.parameters()])


def assert_replicas_agree(model):
    mine = flat_params(model)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size())]
    dist.all_gather(out, mine)
    assert all(torch.equal(out[0], o) for o in out[1:]), "replicas differ"


def backend_case(out):
    """The backend's settings compress DDP's allreduce; the callback only logs the stats."""
    import torch_cgx
    from torch_cgx.integrations import attach

    torch_cgx.reset_stats()
    trainer = trainer_for(out)
    cb = attach(trainer)
    assert trainer.callback_handler.callbacks[0] is cb  # before the loggers
    trainer.train()
    s = torch_cgx.stats()
    assert s.calls_compressed >= STEPS and 0 < s.bytes_sent < s.bytes_exact / 6, s
    assert s.plan.startswith("maxmin 4 bits"), s.plan
    logged = [h for h in trainer.state.log_history if "cgx/ratio" in h]
    assert len(logged) >= STEPS // 2 and logged[-1]["cgx/bytes_sent"] == s.bytes_sent
    assert logged[0]["cgx/bytes_per_step"] > 0
    assert_replicas_agree(trainer.model)


class Snapshot:
    """A test callback (after CGXCallback): the hook state's residuals at a save and at the
    start of training."""

    def __init__(self, cb):
        from transformers import TrainerCallback

        self.cb, self.saved, self.begin = cb, {}, None
        snap = self

        class _C(TrainerCallback):
            def on_save(self, args, state, control, **kw):
                snap.saved[state.global_step] = snap.copy()

            def on_train_begin(self, args, state, control, **kw):
                snap.begin = snap.copy()

        self.callback = _C()

    def copy(self):
        st = self.cb.state
        if hasattr(st, "residuals"):  # CGXState, CompressionState
            return st.steps, {k: v.clone() for k, v in st.residuals.items()}
        memory = {("error", k): v.clone() for k, v in st.error_dict.items()}  # PowerSGDState
        memory.update({("q", k): v.clone() for k, v in st.q_memory_dict.items()})
        return st.iter, memory


def hook_case(out):
    """cgx_hook (4 bits, error feedback) through the callback on an exact group; a checkpoint
    at step 3; resume from it restores the residuals bit for bit."""
    import torch_cgx
    from torch_cgx.integrations import attach

    torch_cgx.set_config(None, bits=32)  # only the hook compresses
    params = {"error_feedback": True}
    trainer = trainer_for(out, save_strategy="steps", save_steps=3)
    cb = attach(trainer, hook="cgx", bits=4, params=params)
    snap = Snapshot(cb)
    trainer.add_callback(snap.callback)
    trainer.train()
    h = torch_cgx.stats(cb.state)
    assert h.hook == "cgx_hook" and h.steps == STEPS and cb.state.steps == STEPS, h
    assert h.calls_compressed >= STEPS and 0 < h.bytes_sent < h.bytes_exact / 4, h
    assert h.bytes_sent <= torch_cgx.stats().bytes_sent
    assert "cgx_hook/ratio" in trainer.state.log_history[-2]
    assert_replicas_agree(trainer.model)
    steps3, res3 = snap.saved[3]
    assert steps3 == 3 and res3, "no residuals saved at step 3"
    final = flat_params(trainer.model)

    resumed = trainer_for(out, save_strategy="steps", save_steps=3)
    cb2 = attach(resumed, hook="cgx", bits=4, params=params)
    snap2 = Snapshot(cb2)
    resumed.add_callback(snap2.callback)
    resumed.train(resume_from_checkpoint=os.path.join(out, "checkpoint-3"))
    steps, res = snap2.begin
    assert steps == 3 and res.keys() == res3.keys()
    assert all(torch.equal(res[k], res3[k]) for k in res3), "residuals differ after resume"
    assert cb2.state.steps == STEPS and torch_cgx.stats(cb2.state).steps == STEPS - 3
    assert_replicas_agree(resumed.model)
    # The continued run is the uninterrupted one, bit for bit: Trainer's DDP has
    # find_unused_parameters=True, so its gradient buckets keep one layout (docs/hooks.md
    # "Checkpoints"), and Trainer restores the data order, optimizer and random states.
    assert torch.equal(flat_params(resumed.model), final), "resumed run differs"


def exact_case(out, scale=1.0):
    """cgx_hook at 8 bits through the callback, one step of plain SGD: the step applied the
    exact average of the ranks' gradients, within the 8-bit bound (exact_reference.py)."""
    import copy

    import torch_cgx
    from torch_cgx.integrations import attach

    torch_cgx.set_config(None, bits=32)  # only the hook compresses
    model = tiny_gpt2()
    for m in model.modules():  # no dropout: the reference computes the same function
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.0
    initial, seen = copy.deepcopy(model), ref.record_first_call(model)
    trainer = trainer_for(out, steps=1, model=model, optim="sgd", learning_rate=1.0,
                          lr_scheduler_type="constant", max_grad_norm=0.0,
                          average_tokens_across_devices=False)  # fmt: skip
    attach(trainer, hook="cgx", bits=8)
    trainer.train()
    # The loss Trainer took on this rank's batch (its num_items_in_batch included: this rank's).
    loss = lambda m: m(**seen["kwargs"]).loss  # noqa: E731
    ref.check_first_step("Trainer + cgx_hook", initial, trainer.model, 1.0, loss, 8, scale)


def accelerate_case(scale=1.0):
    """A bare accelerate loop on the cgx group, compression_hook (8 bits) registered by hand;
    its first step applied the exact average of the ranks' gradients (exact_reference.py)."""
    import copy

    from accelerate import Accelerator

    import torch_cgx
    from torch_cgx.hook_stats import counted

    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    initial = copy.deepcopy(model)
    model, opt = accelerator.prepare(model, torch.optim.SGD(model.parameters(), lr=0.1))
    assert isinstance(model, torch.nn.parallel.DistributedDataParallel)
    assert dist.get_backend(model.process_group) == "cgx"
    state = torch_cgx.CompressionState(None, "maxmin", {"bits": 8}, module=model.module)
    model.register_comm_hook(state, counted(torch_cgx.compression_hook, state))
    g = torch.Generator().manual_seed(dist.get_rank())
    for step in range(4):
        x = torch.randn(16, 64, generator=g)
        accelerator.backward(model(x).pow(2).mean())
        opt.step()
        opt.zero_grad()
        if step == 0:
            loss = lambda m, x=x: m(x).pow(2).mean()  # noqa: E731
            ref.check_first_step("accelerate", initial, model.module, 0.1, loss, 8, scale)
    h = torch_cgx.stats(state)
    assert h.steps == 4 and h.calls_compressed == 4 and 0 < h.bytes_sent < h.bytes_exact / 2, h
    assert_replicas_agree(model)


def quiet_checks(out):
    """The "never compress silently nothing" checks that must stay silent or fire once on a
    cgx group: a hook that never ran; a compressing group that compressed nothing."""
    from transformers import TrainerControl, TrainerState

    import torch_cgx
    from torch_cgx import hook_stats, hooks
    from torch_cgx.integrations import CGXCallback

    cb = CGXCallback(check_after=2)
    cb.state = hooks.CGXState(None, compression_params={"bits": 4})
    hook_stats.counted(hooks.cgx_hook, cb.state)  # made, never run
    cb._check_at = 2
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for step in (1, 2, 3):
            cb.on_step_end(None, TrainerState(global_step=step), TrainerControl())
    assert len(ours(record)) == 1 and "did not run in 2 steps" in str(ours(record)[0].message)

    torch_cgx.set_config(None, bits=4, min_size=1 << 40)  # every bucket under min_size
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer = trainer_for(out, steps=3)
        from torch_cgx.integrations import attach

        attach(trainer, check_after=2)
        trainer.train()
    assert len(ours(record)) == 1, [str(w.message) for w in ours(record)]
    assert "no allreduce of the last 2 steps was compressed" in str(ours(record)[0].message)


def body_cgx(rank, world, out):
    import torch_cgx
    from torch_cgx.integrations import init_cgx

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        group = init_cgx(bits=4)
        assert torch_cgx.is_cgx_group(group) and init_cgx() is group
        with pytest.raises(ValueError, match="set_config"):
            init_cgx(bits=8)
        backend_case(os.path.join(out, "backend"))
        hook_case(os.path.join(out, "hook"))
        exact_case(os.path.join(out, "exact"))
        accelerate_case()
    assert ours(record) == [], [str(w.message) for w in ours(record)]  # no false alarms
    quiet_checks(os.path.join(out, "quiet"))
    dist.destroy_process_group()


def test_trainer_on_cgx_backend_hook_resume_and_checks(tmp_path):
    run_ranks(body_cgx, 2, str(tmp_path), env={"CGX_COMPRESSION_QUANTIZATION_BITS": "4"},
              timeout=240)  # fmt: skip


def powersgd_resume(out):
    """PowerSGD through the callback on a Gloo group; resume from a checkpoint restores its
    memory (error and Q per layer) bit for bit, and the continued run is the uninterrupted one."""
    import torch_cgx
    from torch_cgx.integrations import attach

    def run(resume):
        trainer = trainer_for(out, steps=5, save_strategy="steps", save_steps=3)
        cb = attach(trainer, hook="powersgd")  # PowerSGD from the 2nd step
        snap = Snapshot(cb)
        trainer.add_callback(snap.callback)
        trainer.train(resume_from_checkpoint=resume)
        return trainer, cb, snap

    trainer, cb, snap = run(None)
    h = torch_cgx.stats(cb.state)
    assert h.hook == "powerSGD_hook" and h.steps == 5 and cb.state.iter == 5, h
    assert h.bytes_sent == 0  # a Gloo group: steps and buckets only
    it3, mem3 = snap.saved[3]
    assert it3 == 3 and any(k[0] == "q" for k in mem3), mem3.keys()
    resumed, cb2, snap2 = run(os.path.join(out, "checkpoint-3"))
    it, mem = snap2.begin
    assert it == 3 and mem.keys() == mem3.keys()
    assert all(torch.equal(mem[k], mem3[k]) for k in mem3), "PowerSGD memory differs"
    assert torch.equal(flat_params(resumed.model), flat_params(trainer.model))


def body_gloo(rank, world, out):
    """Trainer creates the group (Gloo) while CGX_* asks for compression: one warning naming
    the setting and the backend; PowerSGD through the callback runs there; a cgx hook and
    init_cgx afterwards are ValueErrors naming the backend."""
    from torch_cgx.integrations import attach, init_cgx

    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        trainer = trainer_for(out, steps=2)
        attach(trainer)
        trainer.train()
        powersgd_resume(os.path.join(out, "powersgd"))
        with pytest.raises(ValueError, match="hook 'cgx' runs on a cgx group"):
            t = trainer_for(out, steps=1)
            attach(t, hook="cgx")
            t.train()
    msgs = [str(w.message) for w in ours(record)]
    assert len(msgs) == 1, msgs
    assert "CGX_COMPRESSION_QUANTIZATION_BITS=4" in msgs[0] and "'gloo'" in msgs[0], msgs
    assert dist.get_backend() == "gloo"
    with pytest.raises(ValueError, match="already initialized with backend 'gloo'"):
        init_cgx()
    dist.destroy_process_group()


def test_trainer_on_gloo_with_cgx_settings_warns_once(tmp_path):
    run_ranks(body_gloo, 2, str(tmp_path), env={"CGX_COMPRESSION_QUANTIZATION_BITS": "4"},
              timeout=180)  # fmt: skip


EXIT_SCRIPT = """
import torch.distributed as dist, torch_cgx
dist.init_process_group("{backend}", init_method="tcp://127.0.0.1:{port}", rank=0, world_size=1)
if {subgroup}:
    dist.new_group([0], backend="cgx")
"""
BITS4 = {"CGX_COMPRESSION_QUANTIZATION_BITS": "4"}
EXIT_CASES = [  # (world group's backend, a cgx subgroup too, variables, warnings expected)
    ("gloo", False, BITS4, 1),
    ("gloo", False, {"CGX_COMPRESSOR": "topk"}, 1),
    ("gloo", False, {"CGX_COMPRESSION_QUANTIZATION_BITS": "32"}, 0),
    ("gloo", False, {}, 0),
    ("cgx", False, BITS4, 0),
    ("gloo", True, BITS4, 0),
]


def test_exit_check_after_a_gloo_only_run():
    """``import torch_cgx`` arms an exit check only when CGX_* asks for compression: a process
    that ends with a Gloo default group and no cgx group is told once, at exit; one with a cgx
    world or a cgx subgroup is not (the cases run as processes side by side)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("CGX_")}
    procs = []
    for backend, subgroup, env, _ in EXIT_CASES:
        code = EXIT_SCRIPT.format(backend=backend, port=free_port(), subgroup=subgroup)
        procs.append(subprocess.Popen([sys.executable, "-c", code], env={**base, **env},
                                      stderr=subprocess.PIPE, text=True))  # fmt: skip
    for p, (backend, subgroup, env, expected) in zip(procs, EXIT_CASES):
        _, err = p.communicate(timeout=90)
        assert p.returncode == 0, err
        assert err.count("NothingCompressedWarning") == expected, (backend, subgroup, env, err)
        if expected:
            name = next(iter(env))
            assert f"{name}={env[name]}" in err and "'gloo'" in err, err


def test_requested_settings():
    from torch_cgx.warn import requested

    assert requested({"CGX_COMPRESSION_QUANTIZATION_BITS": "4"}) == [
        "CGX_COMPRESSION_QUANTIZATION_BITS=4"
    ]
    assert requested({"CGX_COMPRESSION_QUANTIZATION_BITS": "32", "CGX_COMPRESSOR": "maxmin"}) == []
    assert requested({"CGX_COMPRESSOR": "auto"}) == ["CGX_COMPRESSOR=auto"]
    assert requested({"CGX_COMPRESSION_QUANTIZATION_BITS": "x"}) == []  # creation names it
    assert requested({}) == []


def test_bad_callback_arguments_are_value_errors():
    from torch_cgx.integrations import CGXCallback, init_cgx

    with pytest.raises(ValueError, match="check_after"):
        CGXCallback(check_after=0)
    with pytest.raises(ValueError, match="not with a state object"):
        from torch_cgx import hooks

        CGXCallback(hooks.CGXState(None), bits=4)
    with pytest.raises(ValueError, match="init_cgx"):
        CGXCallback(bits=4)
    with pytest.raises(ValueError, match="params must be a dict"):
        CGXCallback("cgx", params=[1])
    with pytest.raises(TypeError, match="torch_cgx.Options"):
        init_cgx({"bits": 4})
    with pytest.raises(ValueError, match="not both"):
        import torch_cgx

        init_cgx(torch_cgx.Options(bits=4), bits=4)
    from transformers import TrainerControl, TrainerState

    with pytest.raises(ValueError, match="needs its trainer"):
        CGXCallback("cgx").on_train_begin(None, TrainerState(), TrainerControl())
