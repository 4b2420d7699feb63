"""hivemind-style compression policies as the gradient policy of DDP on real cgx ranks: each
choice's gradients are averaged in one call with its codec (exact ones bit-identical to the exact
average, quantized ones within their bound) and every rank ends with the same values."""

from __future__ import annotations

import torch
import torch.distributed as dist
from dist_helpers import run_ranks


def make_model():
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 64),  # weight 4096, bias 64
        torch.nn.Tanh(),
        torch.nn.Linear(64, 32),  # weight 2048, bias 32
    )


def batch(step, rank):
    g = torch.Generator().manual_seed(1000 * step + rank)
    return torch.randn(16, 64, generator=g), torch.randn(16, 32, generator=g)


def loss_of(model, x, y):
    return torch.nn.functional.mse_loss(model(x), y)


def exact_grads(params, step, world):
    """Every rank's local gradients at `params` (computed here) and their exact average."""
    model = make_model()
    model.load_state_dict(params)
    per_rank = []
    for r in range(world):
        model.zero_grad()
        loss_of(model, *batch(step, r)).backward()
        per_rank.append({n: p.grad.clone() for n, p in model.named_parameters()})
    mean = {n: (per_rank[0][n] + per_rank[1][n]) / 2 for n in per_rank[0]}
    return per_rank, mean


def recording(hook, order):
    """`hook`, noting the parameter order of each bucket (what the codec's buckets span)."""

    def wrapped(state, bucket):
        order[bucket.index()] = [id(p) for p in bucket.parameters()]
        return hook(state, bucket)

    return wrapped


def assert_same_on_all_ranks(tensors, group, world):
    for t in tensors:
        out = [torch.empty_like(t) for _ in range(world)]
        dist.all_gather(out, t, group=group)
        assert all(torch.equal(o, out[0]) for o in out)


def concat_bound(per_rank, names, bits, config):
    """The max-min allreduce bound for the concatenation of `names` (in bucket order)."""
    from torch_cgx.bounds import allreduce_error_bound

    flats = [torch.cat([g[n].reshape(-1) for n in names]) for g in per_rank]
    return allreduce_error_bound(flats, bits, config.bucket_size, config.algorithm, average=True)


def body_size_policy(rank, world):
    import torch_cgx
    from torch_cgx import compression as C

    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    config = torch_cgx.get_config()
    model = make_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    policy = C.SizeAdaptiveCompression(1000, C.NoCompression(), C.Uniform8BitQuantization())
    state = C.PolicyState(ddp, policy, error_feedback=False)
    order = {}
    ddp.register_comm_hook(state, recording(C.policy_hook, order))
    names = {id(p): n for n, p in model.named_parameters()}
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for step in range(3):
        per_rank, mean = exact_grads(model.state_dict(), step, world)
        opt.zero_grad()
        loss_of(ddp, *batch(step, rank)).backward()
        got = {n: p.grad for n, p in model.named_parameters()}
        for n in ("0.bias", "2.bias"):  # small: exact, bit for bit
            assert torch.equal(got[n], mean[n]), (step, n)
        (bucket,) = order.values()
        big = [names[i] for i in bucket if names[i].endswith("weight")]  # both in one call
        bound = concat_bound(per_rank, big, 8, config)
        err = torch.cat([(got[n] - mean[n]).reshape(-1) for n in big]).abs().double()
        assert torch.all(err <= bound), (step, float((err - bound).max()))
        assert err.max() > 0  # quantized, not exact
        assert_same_on_all_ranks(list(got.values()), gloo, world)
        opt.step()
    assert_same_on_all_ranks([p.detach() for p in model.parameters()], gloo, world)
    assert {k[0] for k in state.states} == {"exact", "maxmin"}
    assert all(s.steps == 3 for s in state.states.values())
    dist.destroy_process_group()


def body_per_tensor(rank, world):
    import torch_cgx
    from torch_cgx import compression as C

    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    config = torch_cgx.get_config()
    model = make_model()
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    policy = C.PerTensorCompression({
        "0.weight": C.Uniform8BitQuantization(),
        "0.bias": C.CGXCompression("maxmin", bits=4),  # a vector, compressed: the policy says so
        "2.weight": C.Float16Compression(),
        "2.bias": C.NoCompression(),
    })  # fmt: skip
    state = C.register_policy(ddp, policy)  # error feedback: on for max-min (biased)
    per_rank, mean = exact_grads(model.state_dict(), 0, world)
    loss_of(ddp, *batch(0, rank)).backward()
    got = {n: p.grad for n, p in model.named_parameters()}
    assert torch.equal(got["2.bias"], mean["2.bias"])
    for name, bits in (("0.weight", 8), ("0.bias", 4)):  # first step: no residual yet
        err = (got[name] - mean[name]).abs().reshape(-1).double()
        assert torch.all(err <= concat_bound(per_rank, [name], bits, config)), name
        assert err.max() > 0
    # fp16: each rank's value and the sum rounded to fp16 (2^-11 relative each), then halved
    total = per_rank[0]["2.weight"].abs() + per_rank[1]["2.weight"].abs()
    err = (got["2.weight"] - mean["2.weight"]).abs()
    assert torch.all(err <= total * 2.0**-10 + 2.0**-24) and err.max() > 0
    assert_same_on_all_ranks(list(got.values()), gloo, world)
    residuals = {n for s in state.states.values() for n in s.residuals}
    assert residuals == {"0.weight", "0.bias"}  # fp16 is unbiased: no error feedback
    dist.destroy_process_group()


def test_size_policy_exact_small_quantized_large_identical_replicas():
    run_ranks(body_size_policy, 2, timeout=120)


def test_per_tensor_policy_mixes_four_codecs_in_one_bucket():
    run_ranks(body_per_tensor, 2, timeout=120)
