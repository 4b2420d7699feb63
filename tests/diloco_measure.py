"""DiLoCo's bytes and time per sync (docs/diloco.md#measured): ``python tests/diloco_measure.py``.

2 ranks on 127.0.0.1 (Gloo): this rank's payload bytes per sync and the wall time of a sync of a
2.1M-parameter fragment (two 1024 x 1024 linear layers), for each compressor (the mean of 5
syncs after one warm-up; ``sync_every=1``, the parameters moved by noise between syncs).
"""

import os
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

CASES = [
    (None, None),
    ("fp16", {}),
    ("maxmin", {"bits": 8}),
    ("maxmin", {"bits": 4}),
    ("maxmin", {"bits": 2}),
    ("topk", {"ratio": 0.01}),
    ("sparseloco", {"ratio": 0.03, "chunk": 4096, "bits": 2}),  # SparseLoCo's defaults
]


def body(rank, world, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), GLOO_SOCKET_IFNAME="lo")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    from torch_cgx import compressors
    from torch_cgx.diloco import DiLoCo

    for comp, params in CASES:
        if comp is not None and comp not in compressors.names():
            continue
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(1024, 1024), torch.nn.Linear(1024, 1024))
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        d = DiLoCo(model, opt, sync_every=1, compressor=comp, compressor_params=params)
        times = []
        with d:
            for _ in range(6):
                with torch.no_grad():
                    for p in model.parameters():
                        p.add_(torch.randn_like(p), alpha=1e-3)
                dist.barrier()
                t0 = time.perf_counter()
                opt.step()
                times.append(time.perf_counter() - t0)
        n = sum(p.numel() for p in model.parameters())
        per_sync = d.payload_bytes / 6 if comp else 4 * n
        if rank == 0:
            label = comp or "exact fp32"
            if params:
                label += " " + ",".join(f"{k}={v}" for k, v in params.items())
            print(
                f"{label:40s} {per_sync / 1e6:8.3f} MB/sync  {4 * n / per_sync:6.1f}x  "
                f"{1e3 * sum(times[1:]) / 5:7.1f} ms/sync",
                flush=True,
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(body, args=(2, port), nprocs=2, start_method="spawn")
