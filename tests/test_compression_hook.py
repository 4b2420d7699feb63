"""The compression hook on real ranks: any compressor, error feedback that makes a biased
compressor deliver the whole gradient over time, residuals that survive DDP's bucket rebuild and
a checkpoint, bit-identical replicas, clear errors."""

from __future__ import annotations

import io
import pickle

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks


def fixed_gradient_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 64, bias=False), torch.nn.Linear(64, 32))


def rank_gradient_input(rank):
    g = torch.Generator().manual_seed(100 + rank)
    return torch.randn(8, 64, generator=g)


def run_steps(ddp, x, steps):
    """Loss linear in the weights: every step has the same gradient. Returns the averaged
    gradients DDP delivered, per step."""
    out = []
    for _ in range(steps):
        ddp.zero_grad()
        ddp(x).sum().backward()
        out.append([p.grad.clone() for p in ddp.parameters()])
    return out


def error_of_mean(grads, steps, exact, w=0):
    """|mean of the first `steps` delivered gradients - exact| / |exact|, of parameter w (the
    compressed 64 x 64 weight)."""
    mean = sum(g[w] for g in grads[:steps]) / steps
    return float((mean - exact[w]).norm() / exact[w].norm())


def body_error_feedback(rank, world, compressor, params, algorithm):
    import torch_cgx
    from torch_cgx import CompressionState, compression_hook

    dist.init_process_group("cgx")
    torch_cgx.set_config(algorithm=algorithm)
    gloo = dist.new_group(backend="gloo")
    x = rank_gradient_input(rank)
    exact = run_steps(torch.nn.parallel.DistributedDataParallel(fixed_gradient_model()), x, 1)[0]
    errors = {}
    for ef in (True, False):
        model = fixed_gradient_model()
        ddp = torch.nn.parallel.DistributedDataParallel(model)
        state = CompressionState(None, compressor, params, error_feedback=ef, momentum=0.0,
                                 layer_min_size=3000,
                                 module=model)  # fmt: skip
        ddp.register_comm_hook(state, compression_hook)
        grads = run_steps(ddp, x, 160)
        errors[ef] = tuple(error_of_mean(grads, steps, exact) for steps in (80, 160))
        for g in grads[-1]:  # bit-identical replicas
            out = [torch.empty_like(g) for _ in range(world)]
            dist.all_gather(out, g, group=gloo)
            assert all(torch.equal(o, out[0]) for o in out)
        assert torch.allclose(grads[-1][1], exact[1], rtol=1e-5, atol=1e-6)  # exact layers
    # With error feedback what a rank did not send is sent later: the residual stays bounded, so
    # the error of the mean delivered gradient keeps falling (as 1 / steps once the residual is
    # bounded; sign compressors take longer to get there). Without it the same part is dropped
    # every step and the error stays.
    (ef80, ef160), (no80, no160) = errors[True], errors[False]
    assert ef160 < 0.8 * ef80 and ef160 < 0.2, errors
    assert no160 > 0.95 * no80 and no160 > 4 * ef160, errors
    dist.destroy_process_group()


@pytest.mark.parametrize(
    "compressor,params,algorithm",
    [
        ("topk", {"ratio": 0.05}, "sra"),
        ("efsignsgd", {}, "allgather"),
        ("onebit", {}, "sra"),
        ("dgc", {"ratio": 0.05}, "sra"),
    ],
)
def test_error_feedback_delivers_the_whole_gradient(compressor, params, algorithm):
    run_ranks(body_error_feedback, 2, compressor, params, algorithm)


def body_checkpoint(rank, world):
    from torch_cgx import CompressionState, compression_hook

    dist.init_process_group("cgx")
    x = rank_gradient_input(rank)

    def fresh(state=None):
        model = fixed_gradient_model()
        ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.01)
        if state is None:
            state = CompressionState(None, "topk", {"ratio": 0.02}, layer_min_size=1000,
                                     module=model)  # fmt: skip
        else:
            state.attach(model)
        ddp.register_comm_hook(state, compression_hook)
        return ddp, state

    ddp, _ = fresh()
    straight = run_steps(ddp, x, 6)
    ddp, state = fresh()
    first = run_steps(ddp, x, 3)  # buckets are rebuilt after the first: residuals stay
    buf = io.BytesIO()
    torch.save(state, buf)
    assert set(state.__getstate__()["residuals"]) == {"0.weight", "1.weight"}
    buf.seek(0)
    restored = torch.load(buf, weights_only=True)  # torch's default: a safe global
    assert restored.process_group is None
    ddp, _ = fresh(restored)
    resumed = first + run_steps(ddp, x, 3)
    for a, b in zip(straight, resumed):
        assert all(torch.equal(u, v) for u, v in zip(a, b))
    dist.destroy_process_group()


def test_residuals_survive_bucket_rebuild_and_checkpoint():
    run_ranks(body_checkpoint, 2)


def test_state_errors_are_clear():
    from torch_cgx import CompressionState

    with pytest.raises(ValueError, match="unknown compressor"):
        CompressionState(compressor="nope")
    with pytest.raises(ValueError, match="ratio"):
        CompressionState(compressor="topk", params={"ratio": 2})
    with pytest.raises(ValueError, match="layer_min_size"):
        CompressionState(layer_min_size=-1)
    s = CompressionState(compressor="onebit")
    assert s.error_feedback is True  # biased: on by default
    assert CompressionState(compressor="qsgd").error_feedback is False
    # +-1 whatever the scale: no residual by default (GRACE's pairing); asked for: kept
    assert CompressionState(compressor="signsgd").error_feedback is False
    assert CompressionState(compressor="signsgd", error_feedback=True).error_feedback is True
    s.residuals[id(object())] = torch.zeros(3)
    with pytest.raises(ValueError, match="module=model"):
        pickle.dumps(s)


def body_momentum(rank, world):
    import torch_cgx
    from torch_cgx import CompressionState, compression_hook

    dist.init_process_group("cgx")
    torch_cgx.set_config(algorithm="allgather")  # each rank's signs summed exactly
    # Signum: the delivered gradient is the mean over ranks of sign(u), u = 0.9 u + g.
    model = fixed_gradient_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = CompressionState(None, "signum", layer_min_size=3000, module=model)
    assert state.momentum == 0.9 and state.error_feedback is False
    ddp.register_comm_hook(state, compression_hook)
    reference = fixed_gradient_model()
    u = [torch.zeros(64, 64) for _ in range(world)]
    for step in range(4):
        xs = [torch.randn(8, 64, generator=torch.Generator().manual_seed(10 * step + r))
              for r in range(world)]  # fmt: skip
        ddp.zero_grad()
        ddp(xs[rank]).sum().backward()
        signs = []
        for r in range(world):
            reference.zero_grad()
            reference(xs[r]).sum().backward()
            u[r] = 0.9 * u[r] + reference[0].weight.grad
            signs.append(torch.where(u[r] < 0, -1.0, 1.0))
        assert torch.equal(model[0].weight.grad, sum(signs) / world), step
    # DGC: momentum correction with masking. After one step u = g and v = g; what was sent
    # leaves residual 0 and a masked momentum: u and the residual are equal everywhere.
    model = fixed_gradient_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    state = CompressionState(None, "dgc", {"ratio": 0.05}, layer_min_size=3000, module=model)
    ddp.register_comm_hook(state, compression_hook)
    ddp(rank_gradient_input(rank)).sum().backward()
    res, mom = state.residuals["0.weight"], state.momenta["0.weight"]
    sent = int((res == 0).sum())
    assert 0 < sent < res.numel() and torch.equal(res, mom)
    dist.destroy_process_group()


def test_momentum_signum_and_dgc_masking():
    run_ranks(body_momentum, 2)
