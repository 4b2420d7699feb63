"""The device engine's hierarchical allreduce on 4 real ranks as 2 nodes of 2 (LOCAL_WORLD_SIZE=2),
against the native hierarchical path over the node's Gloo group (CGX_INNER_COMMUNICATOR_TYPE=GLOO),
in both CGX_INTRA_BROADCAST modes: results, residuals and replicas bitwise equal."""

from __future__ import annotations

import json

import pytest
import torch
import torch.distributed as dist
from device_engine_cases import codec_factory
from dist_helpers import run_ranks

CASES = [
    # name, config changes, dtype, numel, average
    ("maxmin4_sra", dict(bits=4, bucket_size=128), torch.float32, 997, True),
    (
        "maxmin4_ring_bf16",
        dict(bits=4, bucket_size=64, algorithm="ring"),
        torch.bfloat16,
        1000,
        False,
    ),  # fmt: skip
    (
        "maxmin2_stochastic",
        dict(bits=2, bucket_size=64, stochastic=True),
        torch.float32,
        900,
        True,
    ),  # fmt: skip
    ("maxmin4_rotation", dict(bits=4, bucket_size=64, rotation="on"), torch.float32, 1000, True),
    ("topk", dict(compressor="topk", compressor_params="ratio=0.05"), torch.float32, 1000, True),
]


def _transport(group, _world_rank=None):
    from torch_cgx.device.transport import GroupTransport

    return GroupTransport(group, dist.get_rank(group), dist.get_world_size(group))


def _engine(rank, gloo, nodes, crosses, intra_broadcast):
    from torch_cgx.device.engine import DeviceEngine, Hierarchy

    node, local = rank // 2, rank % 2
    if intra_broadcast:
        cross = _transport(crosses[0], rank) if local == 0 else None
    else:
        cross = _transport(crosses[local], rank)
    h = Hierarchy(_transport(nodes[node], rank), cross, local, 2, intra_broadcast)
    return DeviceEngine(_transport(gloo, rank), h, codecs=codec_factory("device"))


def body(rank, world, path):
    import torch_cgx
    from torch_cgx import _C
    from torch_cgx.device.engine import DeviceCall

    common = dict(hierarchical="on", inner_communicator="gloo")
    dist.init_process_group("cgx", pg_options=torch_cgx.Options(intra_broadcast=True, **common))
    slices = dist.new_group(backend="cgx", pg_options=torch_cgx.Options(intra_broadcast=False,
                                                                         **common))  # fmt: skip
    gloo = dist.new_group(backend="gloo")
    nodes = [dist.new_group([0, 1], backend="gloo"), dist.new_group([2, 3], backend="gloo")]
    crosses = [dist.new_group([0, 2], backend="gloo"), dist.new_group([1, 3], backend="gloo")]
    results = {}
    for intra_broadcast, group in ((True, None), (False, slices)):
        backend = torch_cgx.cgx_backend(group)
        assert backend.hierarchical()
        engine = _engine(rank, gloo, nodes, crosses, intra_broadcast)
        base = torch_cgx.get_config(group)
        for salt, (name, changes, dtype, n, average) in enumerate(CASES):
            config = base.replace(**changes)
            g = torch.Generator().manual_seed(100 * salt + rank)
            x = (torch.randn(n, generator=g) * (1 + rank)).to(dtype)
            nat, nres, dev, dres = x.clone(), torch.empty(n), x.clone(), torch.empty(n)
            options = _C.CallOptions(config.to_native()).with_stream(5 + salt)
            backend.allreduce_call(nat, options, average, nres).wait()
            call = DeviceCall.from_config(config, average)
            engine.allreduce(dev, call, stream=5 + salt, residual=dres)
            raw = dev.view(torch.uint8)
            every = [torch.empty_like(raw) for _ in range(world)]
            dist.all_gather(every, raw, group=gloo)
            results[f"{name}_{'leaders' if intra_broadcast else 'slices'}"] = {
                "bitwise": torch.equal(raw, nat.view(torch.uint8)),
                "max_diff": float((dev.float() - nat.float()).abs().max()),
                "residual_bitwise": torch.equal(dres, nres),
                "residual_zero": bool((dres == 0).all()),
                "replicas": all(torch.equal(e, raw) for e in every),
            }
    if rank == 1:  # a non-leader: its residual is zero with leaders
        with open(path, "w") as f:
            json.dump(results, f)
    dist.barrier(gloo)
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    path = str(tmp_path_factory.mktemp("hier") / "results.json")
    run_ranks(body, 4, path, env={"LOCAL_WORLD_SIZE": "2"}, timeout=150)
    with open(path) as f:
        return json.load(f)


@pytest.mark.parametrize("mode", ["leaders", "slices"])
@pytest.mark.parametrize("case", [c[0] for c in CASES])
def test_hierarchical_equals_native(results, case, mode):
    r = results[f"{case}_{mode}"]
    assert r["replicas"], "replicas differ across ranks"
    assert r["bitwise"], f"differs from the native hierarchical path by {r['max_diff']}"
    assert r["residual_bitwise"], "residual differs from the native one"
    if mode == "leaders":
        assert r["residual_zero"]  # rank 1 sends nothing across nodes
