"""torch_cgx's PowerSGD hooks against torch's on the same model and data, on real ranks.

Tolerance of the parity checks: the two compute the same products, norms and sums; they differ
only in rounding order (torch adds, to the exactly averaged gradients, each rank's difference
to the average, which sums to zero over the ranks only up to rounding; P of several matrices are
orthogonalized as one batch). Each step adds a few fp32 roundings (eps = 1.2e-7) relative to the
gradient, so after a few steps parameters agree to ~1e-7 relative; the tests allow 1e-5.
"""

from __future__ import annotations

import io
import pickle

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks


def make_model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(
        torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 256), torch.nn.ReLU(),
        torch.nn.Linear(256, 128), torch.nn.Linear(128, 10),
    )  # fmt: skip


def batch(step: int, rank: int):
    g = torch.Generator().manual_seed(10 * step + rank)
    return torch.randn(16, 64, generator=g), torch.randint(0, 10, (16,), generator=g)


def train(ddp, rank, steps, lr=0.05):
    opt = torch.optim.SGD(ddp.parameters(), lr=lr)
    for step in range(steps):
        x, y = batch(step, rank)
        opt.zero_grad()
        torch.nn.functional.cross_entropy(ddp(x), y).backward()
        opt.step()


def torch_hooks():
    """torch's hooks, ``batched_powerSGD_hook`` mended: in torch 2.13 it hands 2-D matrices to
    ``_orthogonalize``, which asserts 3-D (an AssertionError at the first PowerSGD step)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as tp

    orig = tp._orthogonalize
    if not getattr(orig, "mended", False):

        def mended(m, epsilon=0):
            return orig(m.unsqueeze(0) if m.dim() == 2 else m, epsilon)

        mended.mended = True
        tp._orthogonalize = mended
    return tp


def body_parity(rank, world, batched, kwargs, steps):
    import torch_cgx.hooks as ours
    from benchmarks.train_methods import SerialHook, serial_hook

    tp = torch_hooks()
    dist.init_process_group("gloo")
    ga, gb = dist.new_group(), dist.new_group()
    cap = 25 if batched else 0.1  # torch's batched hook: one bucket (see test_work.py for why)
    a = torch.nn.parallel.DistributedDataParallel(make_model(), process_group=ga, bucket_cap_mb=cap)
    b = torch.nn.parallel.DistributedDataParallel(make_model(), process_group=gb, bucket_cap_mb=cap)
    kw = dict(start_powerSGD_iter=2, min_compression_rate=0.5, **kwargs)
    theirs, mine = tp.PowerSGDState(ga, **kw), ours.PowerSGDState(gb, module=b.module, **kw)
    if batched:
        a.register_comm_hook(theirs, tp.batched_powerSGD_hook)
        b.register_comm_hook(mine, ours.batched_powerSGD_hook)
    else:  # torch's layer-wise hook needs its buckets serialized on Gloo
        a.register_comm_hook(SerialHook(theirs, tp.powerSGD_hook), serial_hook)
        b.register_comm_hook(mine, ours.powerSGD_hook)
    train(a, rank, steps)
    train(b, rank, steps)
    assert mine.iter == theirs.iter == steps
    assert mine.compression_stats() == theirs.compression_stats()
    for (name, pa), pb in zip(a.module.named_parameters(), b.parameters()):
        err = ((pa - pb).abs().max() / pa.abs().max()).item()
        assert err <= 1e-5, (name, err)
    dist.destroy_process_group()


@pytest.mark.parametrize(
    "batched,kwargs",
    [
        (False, {"matrix_approximation_rank": 1}),
        (False, {"matrix_approximation_rank": 4}),  # QR instead of Gram-Schmidt
        (False, {"matrix_approximation_rank": 2, "batch_tensors_with_same_shape": True}),
        (False, {"matrix_approximation_rank": 2, "warm_start": False, "use_error_feedback": False}),
        (True, {"matrix_approximation_rank": 1}),
        (True, {"matrix_approximation_rank": 2}),
    ],
)
def test_powersgd_matches_torch(batched, kwargs):
    run_ranks(body_parity, 2, batched, kwargs, 6, timeout=180)


def body_two_allreduces(rank, world, quantize_bits):
    import torch_cgx
    import torch_cgx.hooks as ours
    from torch_cgx.hooks import powersgd

    dist.init_process_group("cgx")
    torch_cgx.set_config(bits=2)  # the group's own setting: PowerSGD's sums stay exact
    gloo = dist.new_group(backend="gloo")
    calls = []
    for name in ("exact_allreduce", "quantized_allreduce"):
        real = getattr(powersgd, name)
        setattr(powersgd, name, lambda *a, _r=real, _n=name: calls.append(_n) or _r(*a))
    ddp = torch.nn.parallel.DistributedDataParallel(make_model(), bucket_cap_mb=0.1)
    state = ours.PowerSGDState(None, 2, start_powerSGD_iter=2, module=ddp.module,
                               quantize_bits=quantize_bits)  # fmt: skip
    buckets = set()

    def counting_hook(state, bucket):
        buckets.add(bucket.index())
        return ours.powerSGD_hook(state, bucket)

    ddp.register_comm_hook(state, counting_hook)
    train(ddp, rank, 2)
    calls.clear()
    train(ddp, rank, 3)
    assert len(buckets) >= 3  # several buckets, still two allreduces per step
    per_step = ["exact_allreduce"] * 2 if quantize_bits is None else (
        ["exact_allreduce", "quantized_allreduce", "quantized_allreduce"])  # fmt: skip
    assert calls == per_step * 3, calls
    for p in ddp.parameters():
        copies = [torch.empty_like(p) for _ in range(world)]
        dist.all_gather(copies, p.detach(), group=gloo)
        assert all(torch.equal(c, copies[0]) for c in copies)
        assert torch.isfinite(p).all()
    dist.destroy_process_group()


@pytest.mark.parametrize("quantize_bits", [None, 4])
def test_two_allreduces_per_step_on_cgx(quantize_bits):
    run_ranks(body_two_allreduces, 2, quantize_bits, timeout=120)


def body_zero_layer(rank, world):
    import torch_cgx.hooks as ours

    tp = torch_hooks()
    dist.init_process_group("gloo")
    results = []
    for state_cls, hook in ((tp.PowerSGDState, tp.powerSGD_hook),
                            (ours.PowerSGDState, ours.powerSGD_hook)):  # fmt: skip
        ddp = torch.nn.parallel.DistributedDataParallel(make_model())  # one bucket
        ddp.register_comm_hook(state_cls(None, start_powerSGD_iter=2), hook)
        for _ in range(3):  # the first layer sees only zeros: its gradient is all zeros
            ddp.zero_grad()
            ddp(torch.zeros(4, 64)).sum().backward()
        results.append(all(torch.isfinite(p.grad).all() for p in ddp.parameters()))
        del ddp  # its hook state and pending futures go while the group is up
    assert results == [False, True]  # torch's: 0 / 0 in Gram-Schmidt spreads NaN
    # Gloo's threads must not drop the last reference to a tensor at interpreter exit (an
    # abort in 2 of 74 runs before this, 0 of 45 after; torch's own hook runs here too):
    # collect first, then leave together.
    import gc

    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


def test_zero_gradients_stay_finite():
    run_ranks(body_zero_layer, 2, timeout=120)


def body_world_one(rank, world):
    import torch_cgx.hooks as ours

    dist.init_process_group("gloo")
    ddp = torch.nn.parallel.DistributedDataParallel(make_model(), bucket_cap_mb=0.1)
    state = ours.PowerSGDState(None, start_powerSGD_iter=2)
    ddp.register_comm_hook(state, ours.powerSGD_hook)
    train(ddp, rank, 4)
    assert state.iter == 4 and state.q_memory_dict
    dist.destroy_process_group()


def test_world_size_one_runs():
    run_ranks(body_world_one, 1, timeout=60)  # torch's hook hangs here


def test_power_step_edges():
    from torch_cgx.hooks import lowrank

    def never(_):
        raise AssertionError("nothing to reduce")

    lowrank.power_step([], None, 2, 0.0, never, never)  # an empty step issues nothing
    calls = []

    def summed(t):  # a world of 2 identical ranks: the sum doubles
        calls.append(t.numel())
        t.mul_(2)
        fut = torch.futures.Future()
        fut.set_result(t)
        return fut

    exact = torch.arange(5.0)
    lowrank.power_step([], exact, 2, 0.0, summed, never)
    assert calls == [5] and torch.equal(exact, torch.arange(5.0))  # averaged: unchanged
    m = torch.randn(6, 4)
    item = lowrank.Item("w", m.clone(), 4, torch.randn(4, 4))
    item.error = torch.empty(6, 4)
    lowrank.power_step([item], None, 2, 0.0, summed, summed)
    # Full rank: P Q^T reproduces the matrix (the average of two identical ranks).
    assert torch.allclose(item.matrix, m, atol=1e-5) and item.error.abs().max() < 1e-5


def test_state_checks_and_saving():
    from torch_cgx.hooks import PowerSGDState

    for kwargs, match in [
        ({"matrix_approximation_rank": 0}, "matrix_approximation_rank"),
        ({"start_powerSGD_iter": 1}, "start_powerSGD_iter"),
        ({"min_compression_rate": -1}, "min_compression_rate"),
        ({"warm_start": "yes"}, "warm_start"),
        ({"quantize_bits": 9}, "quantize_bits"),
        ({"orthogonalization_epsilon": float("nan")}, "orthogonalization_epsilon"),
    ]:
        with pytest.raises(ValueError, match=match):
            PowerSGDState(None, **kwargs)
    PowerSGDState(None, start_powerSGD_iter=1, use_error_feedback=False, warm_start=False)
    model = torch.nn.Linear(8, 8)
    state = PowerSGDState(None, start_powerSGD_iter=3, random_seed=7, module=model)
    state.error_dict["weight"] = torch.randn(8, 8)
    state.q_memory_dict["weight"] = torch.randn(8, 1)
    state.rng.randint(10)
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    loaded = torch.load(buf, weights_only=True)  # torch's default loader
    assert loaded.start_powerSGD_iter == 3 and loaded.process_group is None
    assert torch.equal(loaded.error_dict["weight"], state.error_dict["weight"])
    assert loaded.rng.randint(1 << 30) == state.rng.randint(1 << 30)  # the seed stream goes on
    anonymous = PowerSGDState(None)
    anonymous.error_dict[id(model.weight)] = torch.zeros(1)
    with pytest.raises(ValueError, match="module=model"):
        pickle.dumps(anonymous)


class FakeBucket:
    """What ``PowerSGDState.bucket_keys`` reads of a DDP gradient bucket."""

    def __init__(self, index, params):
        self._index, self._params = index, params

    def index(self):
        return self._index

    def parameters(self):
        return self._params


def saved_and_loaded(state):
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)  # torch's default loader


def test_state_without_module_saves_by_place():
    """Without module=, memory is saved under its place in the gradient buckets (torch's way)
    and bound to the parameters at that place when the resumed hook first sees the bucket."""
    from torch_cgx.hooks import PowerSGDState

    old = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    state = PowerSGDState(None, start_powerSGD_iter=3)
    w0, b0, w1, b1 = old.parameters()
    keys0 = state.bucket_keys(FakeBucket(0, [w1, b1]))
    keys1 = state.bucket_keys(FakeBucket(1, [w0, b0]))
    assert keys0 == (id(w1), id(b1))  # live memory stays keyed by identity
    err, q = torch.randn(2, 4), torch.randn(4, 1)
    state.error_dict[keys0[0]], state.q_memory_dict[keys0[0]] = err, q
    state.error_dict[keys1] = torch.randn(45)  # the batched hook's key: a bucket's keys
    state.seen_buckets |= {keys0, keys1}
    loaded = saved_and_loaded(state)
    assert set(loaded.error_dict) == {".bucket.0.0", (".bucket.1.0", ".bucket.1.1")}
    assert set(loaded.q_memory_dict) == {".bucket.0.0"}
    assert loaded.seen_buckets == {(".bucket.0.0", ".bucket.0.1"),
                                   (".bucket.1.0", ".bucket.1.1")}  # fmt: skip
    again = saved_and_loaded(loaded)  # saved again before any step: the places stay
    assert set(again.error_dict) == set(loaded.error_dict)

    new = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.Linear(4, 2))
    v0, c0, v1, c1 = new.parameters()
    wrong = loaded.bucket_keys(FakeBucket(1, [v1, c1]))  # other shapes: not bound (yet)
    assert ".bucket.0.0" in loaded.error_dict and wrong not in loaded.seen_buckets
    keys0 = loaded.bucket_keys(FakeBucket(0, [v1, c1]))
    keys1 = loaded.bucket_keys(FakeBucket(1, [v0, c0]))
    assert keys0 == (id(v1), id(c1))
    assert torch.equal(loaded.error_dict[id(v1)], err)
    assert torch.equal(loaded.q_memory_dict[id(v1)], q)
    assert torch.equal(loaded.error_dict[keys1], state.error_dict[(id(w0), id(b0))])
    assert loaded.seen_buckets == {keys0, keys1}  # known buckets: no new random Q drawn

    stray = PowerSGDState(None)  # memory of a parameter in no bucket seen: no place for it
    stray.error_dict[id(w0)] = torch.zeros(1)
    with pytest.raises(ValueError, match="module=model"):
        saved_and_loaded(stray)


def test_state_with_module_saves_names():
    from torch_cgx.hooks import PowerSGDState

    model = torch.nn.Sequential(torch.nn.Linear(8, 4))
    state = PowerSGDState(None, start_powerSGD_iter=3, module=model)
    keys = state.bucket_keys(FakeBucket(0, list(model.parameters())))
    assert keys == ("0.weight", "0.bias")
    state.error_dict["0.weight"] = torch.ones(4, 8)
    state.seen_buckets.add(keys)
    loaded = saved_and_loaded(state)
    assert set(loaded.error_dict) == {"0.weight"} and loaded.seen_buckets == {keys}
    assert loaded.bucket_keys(FakeBucket(3, list(model.parameters()))) == (
        id(model[0].weight),
        id(model[0].bias),
    )
    loaded.attach(model)  # names again: independent of the buckets
    assert loaded.bucket_keys(FakeBucket(3, list(model.parameters()))) == keys


def body_resume(rank, world, phase, tmp, batched, named):
    """test_resume.py's protocol for a state made without module= (bucket places) or with it
    (names)."""
    from test_resume import FIRST, MORE, make_model, steps

    import torch_cgx.hooks as ours

    dist.init_process_group("gloo")
    hook = ours.batched_powerSGD_hook if batched else ours.powerSGD_hook
    model = make_model()
    path = f"{tmp}/psgd-{batched}-{named}-{rank}.pt"
    ckpt = None
    if phase in ("resume", "fresh"):
        ckpt = torch.load(path, weights_only=True)
        model.load_state_dict(ckpt["model"])
    if phase == "resume":
        state = ckpt["hook"]
        assert all(isinstance(k, (str, tuple)) for k in state.error_dict)
        if named:
            state.attach(model)
    else:
        state = ours.PowerSGDState(None, 1, start_powerSGD_iter=3, min_compression_rate=0.5,
                                   module=model if named else None)  # fmt: skip
    # Several gradient buckets, the same in every run: with find_unused_parameters DDP keeps its
    # initial buckets (by default it rebuilds them after the first step in gradient-ready order,
    # and a resumed DDP starts again from the initial ones: torch's caveat, docs/hooks.md).
    ddp = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.05,
                                                    find_unused_parameters=True)  # fmt: skip
    ddp.register_comm_hook(state, hook)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    if phase in ("resume", "fresh"):
        opt.load_state_dict(ckpt["opt"])
        steps(ddp, opt, rank, FIRST, MORE)
        if phase == "resume" and not named:  # every saved place found its parameter
            assert not any(isinstance(k, str) for k in state.error_dict)
    elif phase == "first":
        steps(ddp, opt, rank, 0, FIRST)
        assert len(state._buckets) >= 2  # several gradient buckets
        torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "hook": state}, path)
    else:
        steps(ddp, opt, rank, 0, FIRST + MORE)
    torch.save([p.detach().clone() for p in model.parameters()], f"{path}.{phase}")
    # As in body_zero_layer: the DDP model, its hook state and their futures go while the group
    # is up, and the ranks leave together, so Gloo's threads never drop the last reference to a
    # tensor at interpreter exit (an abort at exit otherwise, about 1 run in 30).
    del ddp, state, opt, ckpt
    import gc

    gc.collect()
    dist.barrier()
    dist.destroy_process_group()


@pytest.mark.parametrize("batched,named", [(False, False), (True, False), (False, True)])
def test_state_resumes_exactly(tmp_path, batched, named):
    for phase in ("full", "first", "resume", "fresh"):  # each in fresh processes
        run_ranks(body_resume, 2, phase, str(tmp_path), batched, named, timeout=120)
    for rank in range(2):
        path = tmp_path / f"psgd-{batched}-{named}-{rank}.pt"
        full, resumed, fresh = (torch.load(f"{path}.{p}") for p in ("full", "resume", "fresh"))
        assert all(torch.equal(a, b) for a, b in zip(full, resumed))
        # Control: a fresh state instead of the saved one differs (the memory mattered).
        assert not all(torch.equal(a, b) for a, b in zip(full, fresh))
