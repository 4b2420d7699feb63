"""Checkpoints of every stateful hook state resume training exactly: N steps, save, load in
fresh processes (torch.load(weights_only=True), torch's default), M more steps, compared bit for
bit with an uninterrupted run of N + M steps. The states are keyed by parameter name, so they
fit whatever buckets DDP forms (a resumed DDP starts again from its initial buckets)."""

from __future__ import annotations

import torch
import torch.distributed as dist
from dist_helpers import run_ranks

FIRST, MORE = 5, 4
HOOKS = ("cgx", "cgx_rotation", "cgx_adaptive", "policy", "topk_ef", "maxmin_ef",
         "dgc_momentum", "powersgd", "powersgd_rank4")  # fmt: skip


class Net(torch.nn.Module):
    """Layers registered last-used first: DDP's initial bucket order (registration order) is
    then its rebuilt one (gradient-ready order), see the note in ``body``."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.out = torch.nn.Linear(128, 10)
        self.mid = torch.nn.Linear(128, 128)
        self.inp = torch.nn.Linear(64, 128)

    def forward(self, x):
        return self.out(torch.relu(self.mid(torch.relu(self.inp(x)))))


def make_model() -> torch.nn.Module:
    return Net()


def make_state(name: str, model):
    from torch_cgx import hooks

    if name.startswith("cgx"):  # residuals, the step (rotation seeds), per-layer bits
        extra = {"cgx": {"error_feedback": True}, "cgx_rotation": {"rotation": True},
                 "cgx_adaptive": {"adaptive_bits": 3.0, "adapt_every": 2}}[name]  # fmt: skip
        bits = 4 if name == "cgx" else 2
        params = {"bits": bits, "bucket_size": 64}
        return hooks.CGXState(compression_params=params, module=model, **extra), hooks.cgx_hook
    if name == "policy":  # biases exact, the rest top-k with error feedback
        from torch_cgx import compression as c

        policy = c.SizeAdaptiveCompression(
            256, c.NoCompression(), c.CGXCompression("topk", ratio=0.05)
        )
        return c.PolicyState(model, policy), c.policy_hook
    if name.startswith("powersgd"):
        rank = 4 if name.endswith("rank4") else 1
        state = hooks.PowerSGDState(None, rank, start_powerSGD_iter=3, min_compression_rate=0.5,
                                    module=model)  # fmt: skip
        return state, hooks.powerSGD_hook
    compressor, params = {
        "topk_ef": ("topk", {"ratio": 0.05}),
        "maxmin_ef": ("maxmin", {"bits": 2, "bucket_size": 64}),
        "dgc_momentum": ("dgc", {"ratio": 0.05}),
    }[name]
    state = hooks.CompressionState(compressor=compressor, params=params, error_feedback=True,
                                   layer_min_size=256, module=model)  # fmt: skip
    return state, hooks.compression_hook


def steps(ddp, opt, rank, first, count):
    for step in range(first, first + count):
        g = torch.Generator().manual_seed(1000 * step + rank)
        x, y = torch.randn(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()


def body(rank, world, phase, tmp):
    import torch_cgx  # noqa: F401  (registers the backend)

    dist.init_process_group("cgx")
    for name in HOOKS:
        model = make_model()
        ckpt_path = f"{tmp}/{name}-{rank}.pt"
        if phase == "resume":
            ckpt = torch.load(ckpt_path, weights_only=True)
            model.load_state_dict(ckpt["model"])
            state, hook = ckpt["hook"], make_state(name, model)[1]
            if name == "policy":  # it saves its memory as a state dict
                state = make_state(name, model)[0]
                state.load_state_dict(ckpt["hook"])
            elif hasattr(state, "attach"):
                state.attach(model, None)
        else:
            state, hook = make_state(name, model)
        # PowerSGD's math is per layer: several buckets, rebuilt by DDP after its first step, and
        # a resumed DDP starts from its initial ones. cgx_hook and compression_hook compress the
        # concatenation of a bucket's layers (CGX's way), so a step's result depends on which
        # layers share a bucket and in what order: one bucket, the same before and after DDP's
        # rebuild for this model (docs/hooks.md).
        cap = 0.05 if name.startswith("powersgd") else 25
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap)
        ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        if phase == "resume":
            opt.load_state_dict(ckpt["opt"])
            steps(ddp, opt, rank, FIRST, MORE)
        elif phase == "first":
            steps(ddp, opt, rank, 0, FIRST)
            saved = state.state_dict() if name == "policy" else state
            torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "hook": saved},
                       ckpt_path)  # fmt: skip
            continue
        else:
            steps(ddp, opt, rank, 0, FIRST + MORE)
        torch.save([p.detach().clone() for p in model.parameters()], f"{tmp}/{name}-{phase}-{rank}")
    dist.destroy_process_group()


def test_hook_states_resume_exactly(tmp_path):
    for phase in ("full", "first", "resume"):  # each in fresh processes
        run_ranks(body, 2, phase, str(tmp_path), timeout=240)
    for name in HOOKS:
        for rank in range(2):
            full = torch.load(tmp_path / f"{name}-full-{rank}")
            resumed = torch.load(tmp_path / f"{name}-resume-{rank}")
            for i, (a, b) in enumerate(zip(full, resumed)):
                assert torch.equal(a, b), f"{name}: parameter {i} differs after resuming"
    run_ranks(body_fresh_state, 2, str(tmp_path), timeout=240)


def body_fresh_state(rank, world, tmp):
    """Control: the same resume with a fresh hook state instead of the saved one differs, so
    the test above sees the state's memory (residuals, momenta, Q, per-layer bits, the step
    counter)."""
    import torch_cgx  # noqa: F401

    dist.init_process_group("cgx")
    for name in HOOKS:  # every state now has memory (the cgx hook: residuals, bits)
        model = make_model()
        ckpt = torch.load(f"{tmp}/{name}-{rank}.pt", weights_only=True)
        model.load_state_dict(ckpt["model"])
        state, hook = make_state(name, model)
        cap = 0.05 if name.startswith("powersgd") else 25
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=cap)
        ddp.register_comm_hook(state, hook)
        opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
        opt.load_state_dict(ckpt["opt"])
        steps(ddp, opt, rank, FIRST, MORE)
        full = torch.load(f"{tmp}/{name}-full-{rank}")
        assert not all(torch.equal(a, b) for a, b in zip(full, model.parameters())), name
    dist.destroy_process_group()
