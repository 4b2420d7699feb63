"""torch_cgx.diloco on 2 real ranks: the outer Nesterov step against a hand computation,
compressed replicas bitwise equal (max-min 4-bit, top-k, threshold, sparseloco, with error
feedback checked by hand), the streaming schedule (offsets, delay, alpha) against
docs/diloco.md's formula, a bit-identical resume, a cgx group."""

from __future__ import annotations

import io

import pytest
import torch
import torch.distributed as dist
from diloco_testing import (
    assert_same_everywhere,
    batches,
    documented,
    gather,
    inner_step,
    make_model,
    sgd1,
    snapshot,
)
from dist_helpers import run_ranks

from torch_cgx import compressors
from torch_cgx.diloco import DiLoCo, Schedule


def _flat(tensors) -> torch.Tensor:
    return torch.cat([t.reshape(-1).float() for t in tensors])


# One spawn of 2 ranks runs every section (a spawn costs seconds); each test reads its outcome.
SECTIONS = (
    "exact_nesterov",
    "compressed",
    "streaming",
    "resume",
    "cgx",
    "sparseloco",
    "semi_async",
)
# SparseLoCo's wire format (top-k of each chunk, 2-bit values), where the registry has it.
SPARSELOCO = ("sparseloco", {"ratio": 0.05, "chunk": 256, "bits": 2})


def body_sections(rank, world, outdir):
    import traceback

    import torch_cgx  # noqa: F401  (registers the backend)

    dist.init_process_group("cgx")  # the default group: cgx; the sections' group: Gloo
    gloo = dist.new_group(backend="gloo")
    for name in SECTIONS:
        try:
            globals()[f"section_{name}"](rank, world, gloo)
            outcome = "ok"
        except Exception:
            outcome = traceback.format_exc()
        with open(f"{outdir}/{name}.{rank}", "w") as f:
            f.write(outcome)
        dist.barrier(group=gloo)
    dist.destroy_process_group()


class Outcomes:
    def __init__(self, outdir, error: str = "") -> None:
        self.outdir, self.error = outdir, error

    def check(self, name: str) -> None:
        for rank in range(2):
            try:
                with open(f"{self.outdir}/{name}.{rank}") as f:
                    text = f.read()
            except FileNotFoundError:
                raise AssertionError(f"section {name} did not finish: {self.error}") from None
            assert text == "ok", f"rank {rank}:\n{text}"


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory):
    outdir = tmp_path_factory.mktemp("diloco")
    try:
        run_ranks(body_sections, 2, str(outdir), timeout=150)
    except Exception as e:  # each test then reports what its section left
        return Outcomes(outdir, repr(e))
    return Outcomes(outdir)


# --- the outer step, by hand ------------------------------------------------------------------


def section_exact_nesterov(rank, world, group):
    model = make_model(seed=rank)  # different starts: the constructor broadcasts rank 0's
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    h, data = 3, batches(rank, 6)
    before = {}  # local parameters after each inner step, before DiLoCo's hook
    opt.register_step_post_hook(lambda *_: before.update(local=snapshot([model])))
    d = DiLoCo(model, opt, sync_every=h, group=group, compressor=None)
    assert_same_everywhere(snapshot([model]), group)
    g = snapshot([model])
    buf = None
    with d:
        for t, batch in enumerate(data, 1):
            inner_step(model, opt, batch)
            if t % h:
                continue
            # Hand: average pseudo-gradient, then SGD with Nesterov momentum 0.9, lr 0.7.
            new = []
            for i, (gi, li) in enumerate(zip(g, before["local"])):
                avg = sum(gi - x for x in gather(li, group)) / world
                b = avg if buf is None else 0.9 * buf[i] + avg
                new.append((gi - 0.7 * (avg + 0.9 * b), b))
            g, buf = [n for n, _ in new], [b for _, b in new]
            for want, got, glob in zip(g, model.parameters(), d.global_parameters().values()):
                torch.testing.assert_close(got.detach(), want, rtol=1e-6, atol=1e-7)
                assert torch.equal(got.detach(), glob)  # alpha = 0: the model is the global
            assert_same_everywhere(snapshot([model]), group)
    assert d.step == 6 and d._fragments[0].syncs == 2
    inner_step(model, opt, data[0])  # outside the context: not counted, no sync
    assert d.step == 6 and not any(torch.equal(a, b) for a, b in zip(g, snapshot([model])))
    d.sync_now()  # outside the schedule: one model everywhere again
    assert d._fragments[0].syncs == 3
    assert_same_everywhere(snapshot([model]), group)


def test_exact_outer_step_is_hand_nesterov(outcomes):
    outcomes.check("exact_nesterov")


# --- compressed: identical replicas, the average and residuals of top-k ------------------------


def _sent(d, model) -> torch.Tensor:
    """What DiLoCo sends at a sync: global - local plus the residual (one fragment)."""
    frag = d._fragments[0]
    res = [frag.residuals.get(n, torch.zeros(g.numel())) for n, g in zip(frag.names, frag.globals)]
    return _flat(frag.globals) - _flat(p.detach() for p in model.parameters()) + _flat(res)


def compressed_run(rank, world, group, name, params, steps=4, by_hand=True):
    """Syncs every 2 steps with ``name``; after each: parameters bitwise equal on every rank,
    the new global copy is the hand-made average (every rank's payload decoded in rank order,
    divided by W; outer SGD lr 1), and the residual is ``x - decode(encode(x))``."""
    model = make_model(seed=rank)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    seen = {}

    def peek(*_):  # before DiLoCo's hook: what it is about to send, the global copy
        seen.update(x=_sent(d, model), g=_flat(d._fragments[0].globals))

    opt.register_step_post_hook(peek)
    d = DiLoCo(model, opt, sgd1, 2, group=group, compressor=name, compressor_params=params)
    assert d.error_feedback  # every compressor here is biased
    c = compressors.get(name, **params)
    with d:
        for t, batch in enumerate(batches(rank, steps), 1):
            inner_step(model, opt, batch)
            if t % 2:
                continue
            assert_same_everywhere(snapshot([model]), group)  # bitwise, every rank
            frag = d._fragments[0]
            res = _flat(frag.residuals[n] for n in frag.names)
            assert res.abs().sum() > 0
            x = seen["x"]
            if not by_hand or not torch.equal(c.encode(x, stream=1), c.encode(x, stream=2)):
                continue  # stochastic: DiLoCo's streams are its own
            total = torch.zeros_like(x)
            for other in gather(x, group):
                c.decode_add_(total, c.encode(other))
            assert torch.equal(_flat(frag.globals), seen["g"] - total / world)
            assert torch.equal(res, x - c.decode(c.encode(x)))
    return d, 4 * sum(p.numel() for p in model.parameters())


def section_compressed(rank, world, group):
    for name, params, most in (
        ("maxmin", {"bits": 4}, 0.25),  # 4 bits + 64 bits per 512 values: < 1/4 of fp32
        ("topk", {"ratio": 0.05}, 0.15),  # 5 % of (index, value) pairs
        ("threshold", {"tau": 0.015}, 1.0),  # data-dependent sizes: gathered first
    ):
        d, fp32 = compressed_run(rank, world, group, name, params)
        assert 0 < d.payload_bytes < 2 * fp32 * most  # 2 syncs


def test_compressed_replicas_bitwise_equal(outcomes):
    outcomes.check("compressed")


def section_sparseloco(rank, world, group):
    if SPARSELOCO[0] not in compressors.names():
        return
    d, fp32 = compressed_run(rank, world, group, *SPARSELOCO)  # Gloo: payloads
    assert d.error_feedback and 0 < d.payload_bytes < 2 * fp32 * 0.15  # 2 syncs, 5 % kept
    compressed_run(rank, world, None, *SPARSELOCO, by_hand=False)  # the cgx backend


def test_sparseloco_style_compressor(outcomes):
    if SPARSELOCO[0] not in compressors.names():
        pytest.skip("no sparseloco compressor registered in this build")
    outcomes.check("sparseloco")


# --- the streaming schedule ----------------------------------------------------------------------


def section_streaming(rank, world, group):
    h, k, delay, alpha, steps = 6, 3, 1, 0.5, 12
    model = make_model(seed=rank, layers=3)
    frags = list(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    local = {}  # step -> this rank's parameters after the inner step, before DiLoCo's hook
    opt.register_step_post_hook(lambda *_: local.__setitem__(len(local) + 1, snapshot(frags)))
    d = DiLoCo(frags, opt, sgd1, h, group=group, compressor=None, fragment_sync_delay=delay,
               fragment_update_alpha=alpha)  # fmt: skip
    starts, applies = documented(h, k, delay)
    sizes = [len(list(m.parameters())) for m in frags]
    first = [sum(sizes[:f]) for f in range(k)]
    glob = [list(d.global_parameters(f).values()) for f in range(k)]
    with d:
        for t, batch in enumerate(batches(rank, steps), 1):
            old = [[g.clone() for g in gs] for gs in glob]
            inner_step(model, opt, batch)
            after = snapshot(frags)
            for f in range(k):
                idx = range(first[f], first[f] + sizes[f])
                if t not in applies[f]:  # untouched: parameters as trained, same global copy
                    assert all(torch.equal(after[i], local[t][i]) for i in idx)
                    assert all(torch.equal(a, b) for a, b in zip(glob[f], old[f]))
                    continue
                s = t - delay
                assert s in starts[f]
                for j, i in enumerate(idx):  # lr 1: global - mean(global - local at the start)
                    avg = sum(old[f][j] - x for x in gather(local[s][i], group)) / world
                    want_g = old[f][j] - avg
                    assert torch.equal(glob[f][j], want_g)
                    assert torch.equal(after[i], torch.lerp(want_g, local[t][i], alpha))
                assert_same_everywhere(glob[f], group)
    assert [f.syncs for f in d._fragments] == [2, 2, 2]


def test_streaming_schedule_delay_and_alpha(outcomes):
    outcomes.check("streaming")


# --- checkpoints -------------------------------------------------------------------------------


def _resume_setup(group, seed):
    model = make_model(seed=seed, layers=2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    d = DiLoCo(list(model), opt, sync_every=4, group=group, compressor="topk",
               compressor_params={"ratio": 0.1}, fragment_sync_delay=1,
               fragment_update_alpha=0.25)  # fmt: skip
    return model, opt, d


def section_resume(rank, world, group):
    n, k = 10, 7  # at step 7 fragment 1's reduction is in flight (starts 3, 7; applies 4, 8)
    data = batches(rank, n)
    model, opt, d = _resume_setup(group, seed=rank)
    with d:
        for batch in data:
            inner_step(model, opt, batch)
    straight = snapshot([model]), d.state_dict()

    model, opt, d = _resume_setup(group, seed=rank)
    with d:
        for batch in data[:k]:
            inner_step(model, opt, batch)
    assert d._fragments[1].pending is not None
    buf = io.BytesIO()
    torch.save(
        {"model": model.state_dict(), "opt": opt.state_dict(), "diloco": d.state_dict()}, buf
    )
    buf.seek(0)
    ckpt = torch.load(buf, weights_only=True)
    model, opt, d = _resume_setup(group, seed=100 + rank)  # other parameters until loaded
    model.load_state_dict(ckpt["model"])
    opt.load_state_dict(ckpt["opt"])
    d.load_state_dict(ckpt["diloco"])
    with d:
        for batch in data[k:]:
            inner_step(model, opt, batch)
    for a, b in zip(straight[0], snapshot([model])):
        assert torch.equal(a, b)
    resumed = d.state_dict()
    for fa, fb in zip(straight[1]["fragments"], resumed["fragments"]):
        for name in fa["globals"]:
            assert torch.equal(fa["globals"][name], fb["globals"][name])
            assert torch.equal(fa["residuals"][name], fb["residuals"][name])
    with pytest.raises(ValueError, match="sync_every"):
        _, _, other = _resume_setup(group, seed=0)
        other.schedule = Schedule(8, 2, 1)
        other.load_state_dict(resumed)


def test_resume_is_bit_identical(outcomes):
    outcomes.check("resume")


# --- a cgx group -------------------------------------------------------------------------------


def section_cgx(rank, world, gloo):
    runs = {}
    for label, group, comp in (("cgx4", None, "maxmin"), ("cgx32", None, None),
                               ("gloo32", gloo, None)):  # fmt: skip
        model = make_model(seed=rank)
        opt = torch.optim.AdamW(model.parameters(), lr=0.01)
        d = DiLoCo(model, opt, sync_every=2, group=group, compressor=comp)
        with d:
            for batch in batches(rank, 4):
                inner_step(model, opt, batch)
        assert_same_everywhere(snapshot([model]))
        runs[label] = (snapshot([model]), d)
    res = runs["cgx4"][1]._fragments[0].residuals
    assert res and all(r.abs().sum() > 0 for r in res.values())  # the backend's residuals
    assert runs["cgx4"][1].payload_bytes > 0
    for a, b in zip(runs["cgx32"][0], runs["gloo32"][0]):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)
    assert any(not torch.equal(a, b) for a, b in zip(runs["cgx4"][0], runs["cgx32"][0]))


def test_cgx_group(outcomes):
    outcomes.check("cgx")


# --- semi-asynchronous: each average applied one window late ----------------------------------


def section_semi_async(rank, world, group):
    model = make_model(seed=rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    h, data = 3, batches(rank, 12)
    before = {}
    opt.register_step_post_hook(lambda *_: before.update(local=snapshot([model])))
    d = DiLoCo(model, opt, sgd1, h, group=group, compressor=None, semi_async=True)
    g, late = snapshot([model]), None  # the global copies; the average in flight
    with d:
        for t, batch in enumerate(data, 1):
            inner_step(model, opt, batch)
            if t % h:
                continue
            # Hand: this window's average against the window's start g; the previous one
            # (started a window ago) applied now; every window starts from the global copies.
            avg = [
                sum(gi - x for x in gather(li, group)) / world for gi, li in zip(g, before["local"])
            ]
            if late is not None:
                g = [gi - a for gi, a in zip(g, late)]
            late = avg
            for want, got in zip(g, model.parameters()):
                torch.testing.assert_close(got.detach(), want, rtol=1e-6, atol=1e-7)
            assert_same_everywhere(snapshot([model]), group)
            assert d._fragments[0].pending is not None  # in flight during the next window
    assert d._fragments[0].syncs == 3  # four windows: three averages applied, one in flight
    # Streaming, alpha 0.5, top-k with error feedback: the global copies agree everywhere
    model = make_model(seed=rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    d = DiLoCo(
        [model[0], model[1]],
        opt,
        None,
        4,
        group=group,
        compressor="topk",
        compressor_params={"ratio": 0.1},
        fragment_update_alpha=0.5,
        semi_async=True,
    )
    with d:
        for batch in batches(rank, 12):
            inner_step(model, opt, batch)
    assert [f.syncs for f in d._fragments] == [2, 2] and d.error_feedback
    for f in range(2):
        assert_same_everywhere(list(d.global_parameters(f).values()), group)
    assert any(r.abs().max() > 0 for r in d._fragments[0].residuals.values())


def test_semi_async_applies_each_average_one_window_late(outcomes):
    outcomes.check("semi_async")
