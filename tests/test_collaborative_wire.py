"""A collaborative round's wire in one process: per-tensor payloads and their corruption, the
sample-weighted average, the butterfly's chunk layout, part bounds and pipelined exchanges."""

from __future__ import annotations

import time

import pytest
import torch

pytest.importorskip("torchft")

from torch_cgx import compression as C  # noqa: E402
from torch_cgx.collaborative import butterfly, wire  # noqa: E402
from torch_cgx.compression import TensorRole  # noqa: E402

# --- payloads and the average -----------------------------------------------------------------

SHAPES = [(4, 300), (7,)]


def _tensors(seed):
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(s, generator=g).reshape(-1) for s in SHAPES]


def test_codec_per_tensor_policy_round_trip_and_bad_payloads():
    policy = C.SizeAdaptiveCompression(1000, C.NoCompression(), C.Uniform8BitQuantization())
    codec = wire.Codec(policy, SHAPES, TensorRole.GRADIENT)
    assert [type(leaf).__name__ for leaf in codec.leaves] == ["Uniform8BitQuantization",
                                                             "NoCompression"]  # fmt: skip
    assert codec.biased == [True, False]
    x = _tensors(0)
    payload = codec.encode(x)
    out = codec.decode(payload)
    assert torch.equal(out[1], x[1])  # exact
    span = float(x[0].max() - x[0].min())
    assert float((out[0] - x[0]).abs().max()) <= span / 255 / 2 + 1e-6  # half a level of 8 bits
    with pytest.raises(ValueError, match="truncated"):
        codec.decode(payload[:-3])
    with pytest.raises(ValueError, match="past its tensors"):
        codec.decode(torch.cat([payload, torch.zeros(2, dtype=torch.uint8)]))
    other = wire.Codec(None, [(7,), (4, 300)], TensorRole.GRADIENT)
    with pytest.raises(ValueError, match="values where"):
        other.decode(payload)
    with pytest.raises(ValueError, match="compression must be a torch_cgx.compression object"):
        wire.Codec("fp16", SHAPES, TensorRole.GRADIENT)


def test_average_is_weighted_by_samples_in_rank_order():
    codec = wire.Codec(C.Float16Compression(), SHAPES, TensorRole.GRADIENT)
    xs = [_tensors(s) for s in range(3)]
    payloads = [codec.encode(x) for x in xs]
    payloads[1] = None
    table = [(24, 0, 8, payloads[0].numel()), (0, 0, 8, 0), (8, 0, 8, payloads[2].numel())]
    got, total = wire.average(codec, table, payloads)
    assert total == 32
    for i in range(len(SHAPES)):
        dec = [codec.decode(p)[i] for p in (payloads[0], payloads[2])]
        want = torch.zeros_like(dec[0]).add_(dec[0] * 24).add_(dec[1] * 8).div_(32)
        assert torch.equal(got[i], want)
    table[1] = (8, 0, 8, 0)  # samples claimed without a payload
    with pytest.raises(ValueError, match="without a payload"):
        wire.average(codec, table, payloads)


# --- the butterfly ----------------------------------------------------------------------------


def test_butterfly_layout_and_bounds():
    numels = [1200, 7, 5000, 1]
    for world in (1, 2, 3, 4, 7):
        parts = butterfly.layout(numels, world)
        covered = sorted((i, s, e) for p in parts for i, s, e in p)
        # every value in exactly one part, the parts within one value of equal
        assert sum(e - s for _, s, e in covered) == sum(numels)
        for i, n in enumerate(numels):
            ranges = sorted((s, e) for j, s, e in covered if j == i)
            assert ranges[0][0] == 0 and ranges[-1][1] == n
            assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
        sizes = [sum(e - s for _, s, e in p) for p in parts]
        assert max(sizes) - min(sizes) <= 1
    # chunks: chunk k's parts are parts k * world ... in flat order, one per peer
    chunked = butterfly.layout(numels, 3, 4)
    assert [s for p in chunked for s in p] == [s for p in butterfly.layout(numels, 12) for s in p]
    assert butterfly.chunk_count(10**6, 3) == 10 and butterfly.chunk_count(1000, 3) == 1
    assert butterfly.chunk_count(10**9, 4) == butterfly.MAX_CHUNKS
    # an averaged part's bound: exact for a fixed-size compressor, a margin otherwise
    table = [(1, 0, 0, 0, 100, 40), (1, 0, 0, 0, 90, 60)]
    fp16 = wire.Codec(C.Float16Compression(), [(4, 3)], TensorRole.GRADIENT)
    assert fp16.fixed_size and butterfly._bound(fp16, table, 1, [(0, 0, 6)]) == 60

    class Mine(C.NoCompression):  # a user's compression: its size may depend on the data
        pass

    assert not wire.Codec(Mine(), [(4, 3)], TensorRole.GRADIENT).fixed_size
    assert butterfly._bound(wire.Codec(Mine(), [(4, 3)], TensorRole.GRADIENT), table, 0,
                            [(0, 0, 6)]) == 110 + 64 + 1024  # fmt: skip
    codec = wire.Codec(C.Float16Compression(), [(4, 3), (5,)], TensorRole.GRADIENT)
    parts = butterfly.layout([12, 5], 2)
    flag = torch.zeros(8, dtype=torch.uint8)
    flag[:4] = 255  # the owner's part outgrew its bound
    with pytest.raises(butterfly.TooLarge):
        butterfly._assemble(codec, parts, [flag, flag])
    big = torch.zeros(8, dtype=torch.uint8)
    big[0] = 200  # a length past the buffer
    with pytest.raises(ValueError, match="byte buffer"):
        butterfly._assemble(codec, parts, [big, big])


class _OnePeer:
    """A process group of one: an all-to-all is a copy (what the schedule of exchanges sees)."""

    def __init__(self):
        self.calls = 0

    def rank(self):
        return 0

    def alltoall_base(self, out, data, into, sends, opts):
        assert into == sends and out.numel() == data.numel()
        self.calls += 1
        out.copy_(data)
        return type("Done", (), {"wait": lambda self: None})()


def test_butterfly_pipeline_runs_every_exchange_and_fails_a_bad_part_in_band():
    codec = wire.Codec(C.Float16Compression(), [(40, 3), (7,)], TensorRole.GRADIENT)
    parts = butterfly.layout([120, 7], 1, 4)
    values = [torch.linspace(-1, 1, 120), torch.arange(7.0)]
    encoded = [codec.encode(values, p) for p in parts]
    table = [(5, 0, 0, 0, *[c.numel() for c in encoded])]
    pg = _OnePeer()
    gathered, _ = butterfly._exchange(pg, codec, parts, encoded, table, {}, time.perf_counter())
    assert pg.calls == 2 * len(parts)  # a reduce-scatter and an all-gather per chunk
    out = butterfly._assemble(codec, parts, gathered)
    for x, y in zip(out, values):  # one contributor: its fp16 values, twice rounded = once
        assert torch.equal(x, y.half().float())
    # a truncated part: its owner says so in-band and runs the remaining exchanges
    bad = list(encoded)
    bad[1] = bad[1][:-3]
    table = [(5, 0, 0, 0, *[c.numel() for c in bad])]
    pg = _OnePeer()
    gathered, _ = butterfly._exchange(pg, codec, parts, bad, table, {}, time.perf_counter())
    assert pg.calls == 2 * len(parts)
    with pytest.raises(ValueError, match="could not average its part"):
        butterfly._assemble(codec, parts, gathered)
