"""Hierarchical allreduce: 4 real ranks as 2 nodes of 2 (LOCAL_WORLD_SIZE=2), exact node sums,
compressed across nodes; both CGX_INTRA_BROADCAST modes."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed as dist
from dist_helpers import run_ranks

from torch_cgx.topology import layout


def _input(rank: int, n: int, dtype, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed * 100 + rank)
    return (torch.randn(n, generator=g) * (1 + rank)).to(dtype)


def _same_everywhere(t: torch.Tensor, gloo) -> None:
    raw = t.contiguous().view(-1).view(torch.uint8)
    got = [torch.empty_like(raw) for _ in range(dist.get_world_size())]
    dist.all_gather(got, raw, group=gloo)
    assert all(torch.equal(g, got[0]) for g in got)


def body_hierarchical(rank, world, intra_broadcast):
    import torch_cgx
    from torch_cgx.bounds import allreduce_error_bound

    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    backend = torch_cgx.cgx_backend()
    assert backend.hierarchical()
    assert torch_cgx.get_config().intra_broadcast is intra_broadcast
    torch_cgx.set_config(bits=4, bucket_size=128)
    seed = 0
    cases = [(dtype, n, op) for dtype in (torch.float32, torch.bfloat16) for n in (997, 65537)
             for op in (dist.ReduceOp.SUM, dist.ReduceOp.AVG)]  # fmt: skip
    cases.append((torch.float32, (4 << 20) + 1001, dist.ReduceOp.SUM))  # 3 shm pieces
    cases.append((torch.float32, (2 << 20) + 7, dist.ReduceOp.AVG))  # a piece of 7 values
    for dtype, n, op in cases:
        seed += 1
        y = _input(rank, n, dtype, seed)
        dist.all_reduce(y, op=op)
        _same_everywhere(y, gloo)
        inputs = [_input(r, n, dtype, seed).double() for r in range(world)]
        nodes = [(inputs[0] + inputs[1]).float(), (inputs[2] + inputs[3]).float()]
        exact = sum(inputs)
        bound = allreduce_error_bound(nodes, 4, 128, "sra", False, 1 << 24, dtype)
        if op == dist.ReduceOp.AVG:
            exact, bound = exact / world, bound / world
        err = (y.double() - exact).abs()
        assert bool((err <= bound).all()), f"{dtype} n={n} {op}: max {err.max():.3g}"
        assert err.max() > 0  # compressed, not exact
    # Only the cross-node part is compressed: leaders (or slice owners) send, inside a node
    # nothing is counted.
    sent = backend.last_bytes_sent()
    local = rank % 2
    assert (sent > 0) if (local == 0 or not intra_broadcast) else (sent == 0)
    # Error feedback: the ranks' residuals add up to what the allreduce lost.
    n = (2 << 20) + 5000  # two shared-memory pieces
    x = _input(rank, n, torch.float32, 77)
    res = torch.empty(n)
    y = x.clone()
    backend.allreduce_with(y, backend.config(), False, res).wait()
    total = torch.stack([_input(r, n, torch.float32, 77) for r in range(world)]).sum(0)
    fed = res.clone()
    dist.all_reduce(fed, group=gloo)
    assert torch.allclose(total - y, fed, atol=1e-4) and (total - y).abs().max() > 0.01
    with pytest.raises(ValueError, match="fixed when the group is created"):
        torch_cgx.set_config(intra_broadcast=not intra_broadcast)
    dist.destroy_process_group()


@pytest.mark.parametrize("inner", ["", "GLOO"])  # shared memory (default) / the node's Gloo
@pytest.mark.parametrize("intra_broadcast", [True, False])
def test_hierarchical_two_nodes_of_two(intra_broadcast, inner):
    env = {"LOCAL_WORLD_SIZE": "2", "CGX_INTRA_BROADCAST": "1" if intra_broadcast else "0",
           "CGX_INNER_COMMUNICATOR_TYPE": inner}  # fmt: skip
    run_ranks(body_hierarchical, 4, intra_broadcast, env=env, timeout=180)


def body_flat_when_off(rank, world):
    import torch_cgx

    dist.init_process_group("cgx")
    assert not torch_cgx.cgx_backend().hierarchical()
    dist.destroy_process_group()


@pytest.mark.parametrize("env", [{"CGX_HIERARCHICAL": "off", "LOCAL_WORLD_SIZE": "2"},
                                 {"LOCAL_WORLD_SIZE": "1"}, {"LOCAL_WORLD_SIZE": "4"}])  # fmt: skip
def test_flat_when_off_or_one_rank_per_node_or_one_node(env):
    run_ranks(body_flat_when_off, 4, env=env, timeout=120)


def test_layout_and_communicator_values():
    from torch_cgx.config import CGXConfig

    assert layout(["a", "b", "a", "c", "b"]) == [[0, 2], [1, 4], [3]]
    for var, value in (("CGX_INNER_COMMUNICATOR_TYPE", "SHM"), ("CGX_CROSS_COMMUNICATOR_TYPE",
                                                                "GLOO")):  # fmt: skip
        assert CGXConfig.from_env({var: value})
    # CGX's other cross-node transports would do nothing here (Gloo carries it): refused.
    with pytest.raises(ValueError, match="CGX_CROSS_COMMUNICATOR_TYPE NCCL would do nothing"):
        CGXConfig.from_env({"CGX_CROSS_COMMUNICATOR_TYPE": "NCCL"})
    with pytest.raises(ValueError, match="CGX_INNER_COMMUNICATOR_TYPE must be one of"):
        CGXConfig.from_env({"CGX_INNER_COMMUNICATOR_TYPE": "RDMA"})
    with pytest.raises(ValueError, match="CGX_HIERARCHICAL must be auto, on or off"):
        CGXConfig.from_env({"CGX_HIERARCHICAL": "maybe"})
    for raw, mode in (("fp16", "fp16"), ("1", "fp16"), ("ON", "fp16"), ("bf16", "bf16"),
                      ("0", "off"), ("off", "off")):  # fmt: skip
        assert CGXConfig.from_env({"CGX_INTRA_COMPRESS": raw}).intra_compress == mode
    with pytest.raises(ValueError, match="CGX_INTRA_COMPRESS must be off, fp16 or bf16"):
        CGXConfig.from_env({"CGX_INTRA_COMPRESS": "int8"})
    with pytest.raises(ValueError, match="CGX_INTRA_COMPRESS needs the shared-memory"):
        CGXConfig.from_env({"CGX_INTRA_COMPRESS": "fp16", "CGX_INNER_COMMUNICATOR_TYPE": "GLOO"})


def _bucket_constant(rank: int, n: int, seed: int) -> torch.Tensor:
    """Values constant over each 128-value bucket: max-min carries them exactly, so the result
    shows the node sums bit for bit."""
    g = torch.Generator().manual_seed(seed * 100 + rank)
    return (torch.randn((n + 127) // 128, generator=g) * (1 + rank)).repeat_interleave(128)[:n]


def _owners(n: int, mode: str) -> torch.Tensor:
    """Which local rank sums each value (hierarchical_shm.cc's layout): pieces of at most one
    8 MiB buffer of fp32 (2/3 of it with 16-bit staging), a multiple of the bucket; each piece
    cut in halves at a multiple of the bucket."""
    elems = (8 << 20) // 4
    per = (elems if mode == "off" else elems * 2 // 3) // 128 * 128
    i = torch.arange(n)
    k = i // per
    m = torch.clamp(n - k * per, max=per)
    return (i - k * per >= ((m + 1) // 2 + 127) // 128 * 128).long()


def body_intra_compress(rank, world, mode, intra_broadcast):
    import torch_cgx

    dist.init_process_group("cgx")
    gloo = dist.new_group(backend="gloo")
    assert torch_cgx.cgx_backend().hierarchical()
    assert torch_cgx.get_config().intra_compress == mode
    torch_cgx.set_config(bits=4, bucket_size=128)
    narrow = {"off": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[mode]
    for seed, n in enumerate([997, 65537, (3 << 20) + 7]):  # the last: several shm pieces
        y = _bucket_constant(rank, n, seed)
        dist.all_reduce(y)
        _same_everywhere(y, gloo)
        x = [_bucket_constant(r, n, seed) for r in range(world)]
        own = _owners(n, mode)
        nodes = []
        for a, b in ((x[0], x[1]), (x[2], x[3])):  # the owner's values stay fp32
            ra, rb = a.to(narrow).float(), b.to(narrow).float()
            nodes.append(torch.where(own == 0, a + rb, ra + b))
        assert torch.equal(y, nodes[0] + nodes[1]), f"{mode} n={n}"
        if mode != "off":  # and the rounding shows: these values are not all 16-bit floats
            assert not torch.equal(y, (x[0] + x[1]) + (x[2] + x[3]))
    dist.destroy_process_group()


@pytest.mark.parametrize("mode,intra_broadcast", [("off", True), ("fp16", True), ("bf16", False),
                                                  ("fp16", False)])  # fmt: skip
def test_intra_compress_stages_node_values_in_16_bits(mode, intra_broadcast):
    env = {"LOCAL_WORLD_SIZE": "2", "CGX_INTRA_BROADCAST": "1" if intra_broadcast else "0",
           "CGX_INTRA_COMPRESS": mode}  # fmt: skip
    run_ranks(body_intra_compress, 4, mode, intra_broadcast, env=env, timeout=180)


def body_small_shm(rank, world):
    import torch_cgx  # noqa: F401

    with pytest.raises(RuntimeError, match=r"could not be set up: rank 0: .*cannot reserve"):
        dist.init_process_group("cgx")


SMALL_SHM = """
import sys
sys.path.insert(0, {tests!r})
from dist_helpers import run_ranks
from test_hierarchical import body_small_shm
if __name__ == "__main__":
    run_ranks(body_small_shm, 4, env={{"LOCAL_WORLD_SIZE": "2"}}, timeout=60)
    print("every rank raised")
"""


def test_too_small_dev_shm_raises_on_every_rank(tmp_path):
    """A /dev/shm too small for the node's segment (containers default to 64 MiB): every rank
    raises naming the problem, instead of SIGBUS on the first write or ranks left waiting. A
    1 MiB tmpfs over /dev/shm in a mount namespace of the test's own (root only)."""
    import shutil
    import subprocess
    import sys

    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs root and unshare for a private /dev/shm")
    script = tmp_path / "small_shm.py"
    script.write_text(SMALL_SHM.format(tests=os.path.dirname(os.path.abspath(__file__))))
    cmd = f"mount -t tmpfs -o size=1m tmpfs /dev/shm && exec {sys.executable} {script}"
    out = subprocess.run(["unshare", "-m", "sh", "-c", cmd], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    if out.returncode != 0 and "mount" in out.stderr and "permission" in out.stderr.lower():
        pytest.skip(f"cannot mount a private /dev/shm here: {out.stderr.strip()[:200]}")
    assert out.returncode == 0 and "every rank raised" in out.stdout, out.stdout + out.stderr
