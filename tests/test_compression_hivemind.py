"""torch_cgx compression objects inside hivemind (skipped without hivemind, an optional extra):
its message format, its averaging between two peers on loopback with the 4-bit max-min codec."""

from __future__ import annotations

import pytest
import torch

hivemind = pytest.importorskip("hivemind")

from hivemind.compression import serialization  # noqa: E402

from torch_cgx import compression as C  # noqa: E402


@pytest.fixture
def slots():
    """Restores hivemind's compression table after a test installs torch_cgx objects."""
    saved = dict(serialization._BASE_COMPRESSION_TYPES)
    yield
    serialization._BASE_COMPRESSION_TYPES.clear()
    serialization._BASE_COMPRESSION_TYPES.update(saved)


def test_messages_round_trip_and_other_messages_still_decode(slots):
    adapter = C.to_hivemind(C.Uniform8BitQuantization(), slot="FLOAT16")
    assert isinstance(adapter, hivemind.compression.CompressionBase)
    x = torch.randn(3, 500)
    info = hivemind.compression.CompressionInfo.from_tensor(x, key="w")
    msg = adapter.compress(x, info)
    assert list(msg.size) == [3, 500] and msg.dtype == "float32"
    assert msg.compression == hivemind.proto.runtime_pb2.CompressionType.FLOAT16
    ours = C.extract(C.Uniform8BitQuantization().compress(x))
    assert torch.equal(serialization.deserialize_torch_tensor(msg), ours)  # hivemind's reader
    assert adapter.estimate_compression_ratio(info) == 0.25  # hivemind's info works as ours
    theirs = hivemind.compression.Float16Compression().compress(x, info)  # hivemind's own bytes
    assert torch.equal(serialization.deserialize_torch_tensor(theirs), x.half().float())
    with pytest.raises(ValueError, match="slot must be one of"):
        C.to_hivemind(C.NoCompression(), slot="NONE")


def make_peer(dht, tensor, compression):
    return hivemind.averaging.DecentralizedAverager(
        [tensor], dht=dht, prefix="cgx-test", target_group_size=2, min_group_size=2,
        compression=compression, start=True,
    )  # fmt: skip


@pytest.mark.timeout(120)
def test_two_peers_average_with_the_4bit_codec(slots):
    codec = C.CGXCompression("maxmin", bits=4, bucket_size=256)
    adapter = C.to_hivemind(codec)  # before the averagers fork: they inherit the slot
    g = torch.Generator().manual_seed(0)
    xs = [torch.randn(20000, generator=g), torch.randn(20000, generator=g) + 0.5]
    first = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"])
    second = hivemind.DHT(start=True, host_maddrs=["/ip4/127.0.0.1/tcp/0"],
                          initial_peers=first.get_visible_maddrs())  # fmt: skip
    peers = [make_peer(d, x.clone(), adapter) for d, x in zip((first, second), xs)]
    try:
        steps = [p.step(wait=False, timeout=60) for p in peers]
        assert all(s.result(timeout=90) is not None for s in steps)
        results = []
        for p in peers:
            with p.get_tensors() as tensors:
                results.append(tensors[0].clone())
    finally:
        for p in peers:
            p.shutdown()
        first.shutdown()
        second.shutdown()
    mean = (xs[0] + xs[1]) / 2
    # The owner of a part averages its own values with the other's decoded ones (error e1 / 2,
    # |e1| <= range / 30 at 4 bits); the other adds the decoded delta (range at most
    # (2 r + r / 15) / 2, error at most that / 30). With r the larger tensor range:
    r = max(float(x.max() - x.min()) for x in xs)
    bound = r / 60 + (2 * r + r / 15) / 60 + 1e-5 * r
    for out in results:
        err = (out - mean).abs()
        assert float(err.max()) <= bound
        # 4-bit steps of ~0.4 leave an rms error of several 1e-2 (8 bits: ~3e-3)
        assert float(err.pow(2).mean().sqrt()) > 0.01
