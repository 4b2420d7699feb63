"""A DDP communication hook for any registered compressor, with error feedback.

``model.register_comm_hook(CompressionState(compressor="topk", params={"ratio": 0.01},
module=model), compression_hook)``. Layers are filtered as in :class:`torch_cgx.CGXState`:
parameters with ``dim() <= 1`` or fewer than ``layer_min_size`` values are averaged exactly, the
others are concatenated and averaged through the backend with the compressor.

Error feedback (GRACE's "residual" memory): for every compressed parameter the state keeps
``e``, what this rank's compression left out last time; the hook sends ``g + e`` and the backend
returns the new ``e = (g + e) - decode(encode(g + e))`` of what this rank sent. It is on by
default for biased compressors (``traits["biased"]``). Residuals are keyed by parameter name
(with ``module=``) or by parameter identity, never by bucket index, so they survive DDP's bucket
rebuild after the first iteration; with ``module=`` they are saved by ``__getstate__`` and
restored by ``__setstate__`` (``torch.save(state)`` in a checkpoint). Memory: one fp32 value per
compressed gradient value. What is fed back is the compression of each rank's own values (the
allgather path of sparse compressors: all of it; SRA: its first stage; a dense compressor's
re-compression of the sum on the owner is not fed back).
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations at run time.
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from torch_cgx import compressors
from torch_cgx.backend import cgx_backend, get_config

__all__ = ["CompressionState", "compression_hook"]

_MAXMIN_FIELDS = ("bits", "bucket_size", "skip_incomplete_buckets", "stochastic")


class CompressionState:
    """State of :func:`compression_hook`.

    Args:
        process_group: a group created with backend ``cgx`` (None: the default group).
        compressor: a name of ``torch_cgx.compressors.names()``.
        params: the compressor's parameters (``compressors.params(name)``); for ``maxmin``:
            ``bits`` (default 4), ``bucket_size``, ``skip_incomplete_buckets``, ``stochastic``.
        error_feedback: keep residuals; None (default): for biased compressors only.
        layer_min_size: parameters with fewer values (or ``dim() <= 1``) are reduced exactly.
        module: the model, to key residuals by parameter name (needed to checkpoint them).
    """

    __slots__ = ("process_group", "compressor", "params", "error_feedback", "layer_min_size",
                 "residuals", "_names")  # fmt: skip

    def __init__(
        self,
        process_group: Optional[dist.ProcessGroup] = None,
        compressor: str = "maxmin",
        params: Optional[Dict[str, Any]] = None,
        error_feedback: Optional[bool] = None,
        layer_min_size: int = 1024,
        module: Optional[torch.nn.Module] = None,
    ) -> None:
        params = dict(params or {})
        if compressor == "maxmin":
            params.setdefault("bits", 4)
        traits = compressors.get(compressor, **params).traits  # ValueError names the problem
        if not isinstance(layer_min_size, int) or layer_min_size < 0:
            raise ValueError(f"layer_min_size must be an integer >= 0, got {layer_min_size!r}")
        if error_feedback is not None and not isinstance(error_feedback, bool):
            raise ValueError(f"error_feedback must be a bool or None, got {error_feedback!r}")
        self.process_group = process_group
        self.compressor, self.params = compressor, params
        self.error_feedback = traits["biased"] if error_feedback is None else error_feedback
        self.layer_min_size = layer_min_size
        self.residuals: Dict[Any, torch.Tensor] = {}
        self._names = {}
        if module is not None:
            self._names = {id(p): name for name, p in module.named_parameters()}

    def compresses(self, param: torch.Tensor) -> bool:
        return param.dim() > 1 and param.numel() >= self.layer_min_size

    def key(self, param: torch.Tensor):
        return self._names.get(id(param), id(param))

    def __getstate__(self):
        if any(not isinstance(k, str) for k in self.residuals):
            raise ValueError(
                "CompressionState keys its residuals by parameter identity, which does not "
                "survive a restart: create it with module=model to checkpoint them"
            )
        return {
            "compressor": self.compressor,
            "params": self.params,
            "error_feedback": self.error_feedback,
            "layer_min_size": self.layer_min_size,
            "residuals": {k: v.clone() for k, v in self.residuals.items()},
        }

    def __setstate__(self, state):
        self.process_group = None  # set it again after loading, as for PyTorch's states
        self.compressor, self.params = state["compressor"], state["params"]
        self.error_feedback, self.layer_min_size = state["error_feedback"], state["layer_min_size"]
        self.residuals = dict(state["residuals"])
        self._names = {}

    def attach(self, module: torch.nn.Module, process_group=None) -> None:
        """After ``__setstate__``: the model whose parameter names key the residuals, and the
        group (None: the default)."""
        self._names = {id(p): name for name, p in module.named_parameters()}
        self.process_group = process_group

    def native_config(self):
        group = get_config(self.process_group)
        if self.compressor == "maxmin":
            fields = {k: v for k, v in self.params.items() if k in _MAXMIN_FIELDS}
            fields = {k: bool(v) if k in ("skip_incomplete_buckets", "stochastic") else int(v)
                      for k, v in fields.items()}  # fmt: skip
            return group.replace(compressor="maxmin", compressor_params="", **fields).to_native()
        return group.replace(compressor=self.compressor, compressor_params=self.params).to_native()


def _spans(state: CompressionState, bucket) -> List[tuple]:
    """(offset, numel, param) of the compressible gradients, and of the others."""
    spans, offset = ([], []), 0
    for p in bucket.parameters():
        spans[0 if state.compresses(p) else 1].append((offset, p.numel(), p))
        offset += p.numel()
    return spans


def _stage(buf: torch.Tensor, spans: List[tuple], whole: bool) -> torch.Tensor:
    return buf if whole else torch.cat([buf[o : o + n] for o, n, _ in spans])


def compression_hook(
    state: CompressionState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket: compressible layers with the state's compressor (and error feedback),
    the rest exactly."""
    backend = cgx_backend(state.process_group)
    buf = bucket.buffer()
    comp, exact = _spans(state, bucket)
    futures, staged = [], []
    if comp:
        tensor = _stage(buf, comp, not exact)
        residual = None
        if state.error_feedback:
            pos = 0
            for _, n, p in comp:
                old = state.residuals.get(state.key(p))
                if old is not None and old.numel() == n:
                    tensor[pos : pos + n] += old.to(tensor.dtype)
                pos += n
            residual = torch.empty(tensor.numel(), dtype=torch.float32)
        futures.append(backend.allreduce_with(tensor, state.native_config(), True, residual))
        staged.append((tensor, comp, residual))
    if exact:
        tensor = _stage(buf, exact, not comp)
        config = get_config(state.process_group).replace(
            bits=32, compressor="maxmin", compressor_params=""
        )
        futures.append(backend.allreduce_with(tensor, config.to_native(), True))
        staged.append((tensor, exact, None))
    futures = [w.get_future() for w in futures]

    def finish(_):
        for tensor, spans, residual in staged:
            pos = 0
            for o, n, p in spans:
                if tensor is not buf:
                    buf[o : o + n].copy_(tensor[pos : pos + n])
                if residual is not None:
                    state.residuals[state.key(p)] = residual[pos : pos + n]
                pos += n
        return buf

    if len(futures) == 1:
        return futures[0].then(finish)
    return torch.futures.collect_all(futures).then(finish)
