"""DiLoCo with the rest, on 4 ranks as 2 "nodes" x 2: DDP inside each node with DiLoCo across
the nodes (torch_cgx.diloco.hierarchical_groups, the outer group cgx), and FSDP2 (fully_shard
over each node, DiLoCo on the local shards across the nodes); both layouts compute the same
training, so exact runs of the two agree."""

from __future__ import annotations

import torch
import torch.distributed as dist
from diloco_testing import assert_same_everywhere, batches, gather, inner_step, make_model
from dist_helpers import run_ranks

H, STEPS = 2, 4


def ddp_layout(rank, compressor):
    """DDP on the node's 2 ranks every step, DiLoCo across nodes every H steps."""
    from torch_cgx.diloco import DiLoCo, hierarchical_groups

    inner, outer = hierarchical_groups(2, inner_backend="gloo", outer_backend="cgx")
    assert dist.get_world_size(inner) == 2 and dist.get_world_size(outer) == 2
    assert dist.get_process_group_ranks(outer) == [rank % 2, rank % 2 + 2]
    model = make_model(seed=rank)  # DDP and DiLoCo's broadcasts make them one model
    ddp = torch.nn.parallel.DistributedDataParallel(model, process_group=inner)
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    world = dist.group.WORLD
    with DiLoCo(model, opt, sync_every=H, group=outer, compressor=compressor):
        for t, batch in enumerate(batches(rank, STEPS), 1):
            inner_step(ddp, opt, batch)
            params = [p.detach() for p in model.parameters()]
            assert_same_everywhere(params, inner)  # DDP: one model per node
            if t % H == 0:
                assert_same_everywhere(params, world)  # DiLoCo: one model everywhere
            else:  # the nodes trained on other data since the last sync
                other = gather(params[0], outer)[1 - rank // 2]
                assert not torch.equal(other, params[0])
    return [p.detach().clone() for p in model.parameters()]


def fsdp_layout(rank, compressor):
    """fully_shard over the node's 2 ranks (a 2 x 2 mesh), DiLoCo over the replicas of each
    shard: pseudo-gradients of the local shards."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import DTensor

    from torch_cgx.diloco import DiLoCo

    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("replicate", "shard"))
    model = make_model(seed=0)
    fully_shard(model, mesh=mesh["shard"])
    opt = torch.optim.AdamW(model.parameters(), lr=0.01)
    replicas = mesh.get_group("replicate")
    assert dist.get_process_group_ranks(replicas) == [rank % 2, rank % 2 + 2]
    d = DiLoCo(model, opt, sync_every=H, group=replicas, compressor=compressor)
    for p, g in zip(model.parameters(), d.global_parameters().values()):
        assert isinstance(p, DTensor) and g.numel() < p.numel()  # a local shard
        assert g.shape == p.to_local().shape
    with d:
        for t, batch in enumerate(batches(rank, STEPS), 1):
            inner_step(model, opt, batch)
            if t % H == 0:
                full = [p.full_tensor() for p in model.parameters()]
                assert_same_everywhere(full, dist.group.WORLD)
    return [p.full_tensor().detach().clone() for p in model.parameters()]


def body_layouts(rank, world):
    import torch_cgx  # noqa: F401  (registers the backend)

    dist.init_process_group("gloo")
    ddp_exact = ddp_layout(rank, None)
    fsdp_exact = fsdp_layout(rank, None)
    for a, b in zip(ddp_exact, fsdp_exact):  # the same training, two layouts
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    ddp_4bit = ddp_layout(rank, "maxmin")
    fsdp_layout(rank, "maxmin")
    assert any(not torch.equal(a, b) for a, b in zip(ddp_exact, ddp_4bit))
    dist.destroy_process_group()


def test_ddp_in_nodes_fsdp2_shards_and_diloco_across():
    run_ranks(body_layouts, 4, timeout=150)
