"""DiLoCo with a torchft-shaped manager, in one process: torchft's calling convention and
keywords, bad arguments, no collective at construction, the average over real contributions
only (a fake two-replica process group), the heal, and one outer optimizer over several
fragments stepping only the syncing one. The real thing: tests/test_diloco_torchft.py."""

from __future__ import annotations

import pytest
import torch
from diloco_testing import make_model

from torch_cgx import compressors
from torch_cgx.diloco import DiLoCo, managed
from torch_cgx.diloco.reduce import Spec


class FakeWork:
    def wait(self):
        return True


class FakeGroup:
    """Replica 0 of two; replica 1's tensors are ``peer`` (one per collective, in order)."""

    def __init__(self, peer):
        self.peer = list(peer)
        self.parent = self

    def size(self):
        return 2

    def rank(self):
        return 0

    def allgather(self, outs, inputs, opts):
        outs[0][0].copy_(inputs[0])
        other = self.peer.pop(0)
        outs[0][1].copy_(torch.zeros_like(inputs[0]))
        outs[0][1][: other.numel()] = other
        return FakeWork()

    def allreduce(self, tensors, opts):
        tensors[0].add_(self.peer.pop(0))
        return FakeWork()


class FakeManager:
    def __init__(self, pg=None, use_async_quorum=False):
        self._pg = pg if pg is not None else FakeGroup([])
        self._use_async_quorum = use_async_quorum
        self.registered, self.errors = {}, []

    def register_state_dict_fn(self, key, load, save):
        assert key not in self.registered
        self.registered[key] = (load, save)

    def start_quorum(self):
        pass

    def should_commit(self):
        return not self.errors

    def report_error(self, e):
        self.errors.append(e)

    def is_participating(self):
        return True


def _model_and_inner():
    model = make_model(seed=0)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_torchft_order_and_keywords_without_a_process_group():
    model, inner = _model_and_inner()
    manager = FakeManager()
    outer = torch.optim.SGD(model.parameters(), lr=0.7)
    # torchft's order, its keywords; no init_process_group here: no collective is issued
    d = DiLoCo(
        manager,
        [model[0], model[1]],
        inner,
        outer,
        4,
        backup_device="cpu",
        pin_memory=False,
        use_bucketization=True,
        bucket_cap_mb=32,
        should_quantize=True,
    )
    assert d.spec.name == "maxmin" and d.spec.params == {"bits": 8}
    assert d.outer_optimizers == [outer, outer] and d.num_fragments == 2
    assert list(manager.registered) == [managed.KEY]
    with pytest.raises(ValueError, match="already registered"):
        DiLoCo(model, inner, sync_every=4, manager=manager)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"manager": FakeManager(use_async_quorum=True)}, "use_async_quorum=False"),
        ({"manager": object()}, "torchft Manager"),
        ({"manager": FakeManager(), "should_quantize": True, "compressor": "topk"}, "give one"),
        ({"manager": FakeManager(), "should_quantize": 1}, "should_quantize"),
        ({"manager": FakeManager(), "bucket_cap_mb": 0}, "bucket_cap_mb"),
        ({"manager": FakeManager(), "sync_every": 0}, "sync_every"),
    ],
)
def test_bad_manager_arguments(kwargs, match):
    model, inner = _model_and_inner()
    kwargs = {"sync_every": 4, **kwargs}
    with pytest.raises(ValueError, match=match):
        DiLoCo(model, inner, **kwargs)


def test_manager_and_group_together_is_an_error():
    model, inner = _model_and_inner()
    with pytest.raises(ValueError, match="not both"):
        DiLoCo(model, inner, sync_every=4, manager=FakeManager(), group=object())


def test_only_real_contributions_are_averaged():
    x = torch.randn(1000, generator=torch.Generator().manual_seed(1))
    peer = torch.randn(1000, generator=torch.Generator().manual_seed(2))
    # exact: the peer sent nothing (healing): its zeros and its count 0; the divisor is 1
    pg = FakeGroup([torch.cat([torch.zeros(1000), torch.zeros(1)])])
    report = {}
    got = managed.start_managed_average(
        FakeManager(pg), x.clone(), Spec(None, None), contributes=True, report=report
    ).wait()
    assert torch.equal(got, x) and report == {"contributors": 1}
    # compressed: both contribute; the sum of both decodes over 2, in rank order
    spec = Spec("maxmin", {"bits": 4})
    codec = compressors.get("maxmin", bits=4)
    theirs = codec.encode(peer, seed=0, stream=(1 << 40) | 5, shared=5)
    pg = FakeGroup([torch.tensor([theirs.numel(), 1]), theirs])
    residual = torch.empty(1000)
    got = managed.start_managed_average(
        FakeManager(pg),
        x.clone(),
        spec,
        contributes=True,
        residual=residual,
        call=5,
        report=report,
    ).wait()
    mine = codec.encode(x, seed=0, stream=5, shared=5)
    expect = torch.zeros(1000)
    codec.decode_add_(expect, mine)
    codec.decode_add_(expect, theirs)
    assert torch.equal(got, expect / 2) and report == {"contributors": 2}
    mine_decoded = torch.zeros(1000)
    codec.decode_add_(mine_decoded, mine)
    assert torch.equal(residual, x - mine_decoded)
    # this replica healing: it sends nothing, its residual is zeros, the peer's payload alone
    pg = FakeGroup([torch.tensor([theirs.numel(), 1]), theirs])
    got = managed.start_managed_average(
        FakeManager(pg),
        x.clone(),
        spec,
        contributes=False,
        residual=residual,
        call=5,
        report=report,
    ).wait()
    alone = torch.zeros(1000)
    codec.decode_add_(alone, theirs)
    assert torch.equal(got, alone) and report == {"contributors": 1}
    assert not residual.any()


def test_heal_takes_the_state_and_resets_parameters_and_residuals():
    source_model, inner = _model_and_inner()
    source = DiLoCo(
        source_model,
        inner,
        sync_every=4,
        manager=FakeManager(),
        compressor="topk",
        compressor_params={"ratio": 0.1},
    )
    with torch.no_grad():
        for g in source._fragments[0].globals:
            g.add_(1.0)
    source.step = 12
    source._fragments[0].residuals = {
        n: torch.ones(g.numel())
        for n, g in zip(source._fragments[0].names, source._fragments[0].globals)
    }
    model, inner2 = _model_and_inner()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(-3)  # a restarted replica's own (wrong) parameters
    healer = DiLoCo(
        model,
        inner2,
        sync_every=4,
        manager=FakeManager(),
        compressor="topk",
        compressor_params={"ratio": 0.1},
    )
    healer._managed._load(source.state_dict())
    assert healer._managed.healed and healer.step == 12
    for p, g in zip(model.parameters(), source._fragments[0].globals):
        assert torch.equal(p.detach(), g)
    assert healer._fragments[0].residuals == {}


def test_one_outer_optimizer_for_two_fragments_steps_only_the_syncing_one():
    from torch_cgx.diloco.fragment import Fragment

    model = make_model(seed=0)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    a, b = Fragment(0, model[0], outer), Fragment(1, model[1], outer)
    b_before = [p.detach().clone() for p in model[1].parameters()]
    with torch.no_grad():
        for p in model.parameters():
            p.sub_(0.1)
    a.outer_step(a.pseudo_gradient(False), 0.0)
    # fragment 1: untouched values, no momentum buffer, its gradients as they were (None)
    for p, before in zip(model[1].parameters(), b_before):
        assert torch.equal(p.detach(), before - 0.1) and p.grad is None
        assert "momentum_buffer" not in outer.state.get(p, {})
    for p in model[0].parameters():
        assert outer.state[p]["momentum_buffer"] is not None
    b.outer_step(b.pseudo_gradient(False), 0.0)
    for p in model[1].parameters():
        assert outer.state[p]["momentum_buffer"] is not None
