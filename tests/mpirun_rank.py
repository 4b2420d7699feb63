"""One rank of tests/test_mpirun.py, started by Open MPI's real mpirun as the README shows:

    CGX_COMPRESSION_QUANTIZATION_BITS=4 mpirun -np 2 python tests/mpirun_rank.py

It sees only Open MPI's variables (OMPI_COMM_WORLD_*) and MASTER_ADDR / MASTER_PORT: no RANK or
WORLD_SIZE. `import torch_cgx` maps them, `init_process_group("cgx")` needs nothing else. Then a
compressed allreduce of known values, checked against the codec's error bound, and an exact one
below min_size. Prints "mpirun rank R of W: ok ..." and exits 0.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist

import torch_cgx
from torch_cgx.bounds import allreduce_error_bound

N = 1 << 16  # compressed: at least min_size values


def rank_input(rank: int, n: int) -> torch.Tensor:
    return torch.linspace(-1.0, 1.0, n) * (rank + 1)


def main() -> None:
    dist.init_process_group("cgx")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert dist.get_backend() == "cgx"
    assert (rank, world) == (
        int(os.environ["OMPI_COMM_WORLD_RANK"]),
        int(os.environ["OMPI_COMM_WORLD_SIZE"]),
    )
    config = torch_cgx.get_config()
    assert config.bits == int(os.environ["CGX_COMPRESSION_QUANTIZATION_BITS"])

    y = rank_input(rank, N)
    dist.all_reduce(y)
    expected = torch.linspace(-1.0, 1.0, N).double() * (world * (world + 1) // 2)
    inputs = [rank_input(r, N) for r in range(world)]
    bound = allreduce_error_bound(inputs, config.bits, config.bucket_size, config.algorithm)
    err = (y.double() - expected).abs()
    assert bool((err <= bound).all()), (
        f"max error {err.max():.3g} at bound {bound[err.argmax()]:.3g}"
    )
    assert float(err.max()) > 0, "4-bit allreduce came back exact: was it compressed?"

    small = torch.full((10,), float(rank + 1))  # below min_size: reduced exactly
    dist.all_reduce(small)
    assert torch.equal(small, torch.full((10,), float(world * (world + 1) // 2)))

    s = torch_cgx.stats()
    assert s.calls_compressed == 1 and s.bytes_sent < s.bytes_exact, s
    print(f"mpirun rank {rank} of {world}: ok, max error {err.max():.3g}, {s}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
