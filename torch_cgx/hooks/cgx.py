"""CGX's layer-wise DDP communication hook: ``model.register_comm_hook(CGXState(...), cgx_hook)``.

Each call reads the layout of the bucket it reduces from ``bucket.parameters()``: parameters
with ``dim() <= 1`` (biases, norms) or fewer than ``layer_min_size`` elements are reduced exactly;
the others are concatenated and reduced with the state's bits and bucket size. Nothing is keyed
by call order, so allreduce calls outside DDP, several DDP models and subgroups keep working.
The hook averages (DDP's convention). Buckets of the codec run over the concatenated
compressible layers; see docs/algorithms.md.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations at run time.
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from torch_cgx.backend import cgx_backend, get_config
from torch_cgx.config import CGXConfig
from torch_cgx.hooks._reduce import exact_config, settled

__all__ = ["CGXState", "cgx_hook"]


class CGXState:
    """State of :func:`cgx_hook`.

    Args:
        process_group: a group created with backend ``cgx`` (None: the default group).
        layer_min_size: parameters with fewer elements are reduced exactly (CGX default 1024).
        compression_params: ``{"bits": 1..8 or 32, "bucket_size": >= 1}``, optionally
            ``"stochastic": bool``; missing keys take the group's settings (``CGX_*`` variables).
    """

    __slots__ = ("process_group", "layer_min_size", "compression_params")

    def __init__(
        self,
        process_group: Optional[dist.ProcessGroup] = None,
        layer_min_size: int = 1024,
        compression_params: Optional[Dict[str, Any]] = None,
    ) -> None:
        if not isinstance(layer_min_size, int) or layer_min_size < 0:
            raise ValueError(f"layer_min_size must be an integer >= 0, got {layer_min_size!r}")
        params = dict(compression_params or {})
        unknown = set(params) - {"bits", "bucket_size", "stochastic"}
        if unknown:
            raise ValueError(f"unknown compression_params key(s): {sorted(unknown)}")
        CGXConfig(**params)  # validates bits / bucket_size / stochastic
        self.process_group = process_group
        self.layer_min_size = layer_min_size
        self.compression_params = params

    def __getstate__(self):
        # The process group cannot be pickled; it is set again after loading (PyTorch's habit).
        return {
            "layer_min_size": self.layer_min_size,
            "compression_params": self.compression_params,
        }

    def __setstate__(self, state):
        self.process_group = None
        self.layer_min_size = state["layer_min_size"]
        self.compression_params = state["compression_params"]

    def compresses(self, param: torch.Tensor) -> bool:
        return param.dim() > 1 and param.numel() >= self.layer_min_size


# torch.load(weights_only=True), torch's default, accepts the state (plain data).
torch.serialization.add_safe_globals([CGXState])


def _split(state: CGXState, bucket) -> List[tuple]:
    """(offset, numel, compress) per gradient in the bucket buffer, in buffer order."""
    spans, offset = [], 0
    for p in bucket.parameters():
        spans.append((offset, p.numel(), state.compresses(p)))
        offset += p.numel()
    return spans


def cgx_hook(state: CGXState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket: compressible layers with the state's bits, the rest exactly."""
    backend = cgx_backend(state.process_group)
    group_config = get_config(state.process_group)
    maxmin = group_config.replace(compressor="maxmin", compressor_params="")  # CGX's codec
    compressed = maxmin.replace(**state.compression_params).to_native()
    exact = exact_config(state.process_group)
    buf = bucket.buffer()
    spans = _split(state, bucket)
    parts = {True: [s for s in spans if s[2]], False: [s for s in spans if not s[2]]}

    futures, staged = [], []
    for compress, config in ((True, compressed), (False, exact)):
        chosen = parts[compress]
        if not chosen:
            continue
        if len(chosen) == len(spans):
            tensor = buf  # the whole bucket: reduce in place, no staging copy
        else:
            tensor = torch.cat([buf[o : o + n] for o, n, _ in chosen])
            staged.append((tensor, chosen))
        futures.append(backend.allreduce_with(tensor, config, True).get_future())

    def unstage(fut):
        settled(fut)
        for tensor, chosen in staged:
            pos = 0
            for o, n, _ in chosen:
                buf[o : o + n].copy_(tensor[pos : pos + n])
                pos += n
        return buf

    if len(futures) == 1:
        return futures[0].then(unstage)
    return torch.futures.collect_all(futures).then(unstage)
