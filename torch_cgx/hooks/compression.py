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
compressed gradient value. What is fed back: every compression of each rank's own values and,
on the chunk a rank owns, the final compression of the sum (SRA, ring), and ring's and the tree's
re-compressions of partial sums: over the ranks, the residuals add up to what was lost.
``torch.load(..., weights_only=True)`` (torch's default) loads the state: the class is registered
as a safe global and its saved form holds only strings, numbers, dicts and tensors.

Momentum (``momentum=m``, default 0.9 for ``signum`` and ``dgc``, else 0): the state keeps
``u = m * u + g`` per parameter and compresses ``u`` (plus the residual) instead of ``g``: DGC's
momentum correction, and Signum (the sign of the momentum). With ``dgc`` (and any sparse
compressor) the momentum is zeroed where a value was sent (DGC's momentum factor masking:
where the new residual is exactly 0; so it needs error feedback, on by default for them).
The delivered gradient then already holds the momentum: use the optimizer without momentum.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations at run time.
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from torch_cgx import compressors
from torch_cgx.backend import cgx_backend, get_config
from torch_cgx.hooks._reduce import bucket_spans, call_stream, exact_config, settled

__all__ = ["CompressionState", "compression_hook"]

_MAXMIN_FIELDS = ("bits", "bucket_size", "skip_incomplete_buckets", "stochastic")
# Per compressor, the hook's defaults where the published method differs from the general ones.
# signsgd decodes to +-1 whatever the gradient's scale, so a residual x - sign(x) is not a
# compression error to feed back (GRACE pairs it with no memory; efsignsgd is the scaled,
# error-feedback variant).
_DEFAULTS = {
    "signsgd": {"error_feedback": False},
    "signum": {"momentum": 0.9, "error_feedback": False},
    "dgc": {"momentum": 0.9},
}


class CompressionState:
    """State of :func:`compression_hook`.

    Args:
        process_group: a group created with backend ``cgx`` (None: the default group).
        compressor: a name of ``torch_cgx.compressors.names()``.
        params: the compressor's parameters (``compressors.params(name)``); for ``maxmin``:
            ``bits`` (default 4), ``bucket_size``, ``skip_incomplete_buckets``, ``stochastic``.
        error_feedback: keep residuals; None (default): for biased compressors only (signsgd and
            signum: off).
        momentum: keep ``u = m * u + g`` and compress it (DGC, Signum); None: 0.9 for ``signum``
            and ``dgc``, else 0.
        layer_min_size: parameters with fewer values (or ``dim() <= 1``) are reduced exactly.
        module: the model, to key residuals by parameter name (needed to checkpoint them).
        plan: ``"auto"``: the group's plan (a group created with ``CGX_COMPRESSOR=auto`` or
            after ``set_config(compressor="auto")``) chooses per call, by the size of the
            bucket's compressible part, exact or how to compress; ``compressor`` and ``params``
            are then unused. Error feedback (on by default) covers what the plan compressed.
    """

    __slots__ = ("process_group", "compressor", "params", "error_feedback", "layer_min_size",
                 "momentum", "residuals", "momenta", "steps", "plan", "_names")  # fmt: skip

    def __init__(
        self,
        process_group: Optional[dist.ProcessGroup] = None,
        compressor: str = "maxmin",
        params: Optional[Dict[str, Any]] = None,
        error_feedback: Optional[bool] = None,
        layer_min_size: int = 1024,
        module: Optional[torch.nn.Module] = None,
        momentum: Optional[float] = None,
        plan: Optional[str] = None,
    ) -> None:
        if plan not in (None, "auto"):
            raise ValueError(f"plan must be None or 'auto', got {plan!r}")
        params = dict(params or {})
        if compressor == "maxmin":
            params.setdefault("bits", 4)
        traits = compressors.get(compressor, **params).traits  # ValueError names the problem
        if not isinstance(layer_min_size, int) or layer_min_size < 0:
            raise ValueError(f"layer_min_size must be an integer >= 0, got {layer_min_size!r}")
        if error_feedback is not None and not isinstance(error_feedback, bool):
            raise ValueError(f"error_feedback must be a bool or None, got {error_feedback!r}")
        defaults = _DEFAULTS.get(compressor, {})
        if error_feedback is None:
            error_feedback = defaults.get("error_feedback", traits["biased"])
        momentum = defaults.get("momentum", 0.0) if momentum is None else momentum
        if isinstance(momentum, bool) or not isinstance(momentum, (int, float)):
            raise ValueError(f"momentum must be a number in [0, 1), got {momentum!r}")
        if not 0 <= momentum < 1:
            raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
        self.process_group = process_group
        self.compressor, self.params = compressor, params
        self.error_feedback = error_feedback
        self.momentum = float(momentum)
        self.layer_min_size = layer_min_size
        self.residuals: Dict[Any, torch.Tensor] = {}
        self.momenta: Dict[Any, torch.Tensor] = {}
        self.steps = 0  # DDP steps seen: numbers the random streams of stochastic compressors
        self.plan = plan
        self._names = {}
        if module is not None:
            self._names = {id(p): name for name, p in module.named_parameters()}

    @staticmethod
    def default_error_feedback(compressor: str) -> bool:
        """Whether a state for ``compressor`` keeps residuals when ``error_feedback`` is None:
        biased compressors do (default parameters), except signum (its momentum plays the part).
        """
        defaults = _DEFAULTS.get(compressor, {})
        return defaults.get("error_feedback", compressors.get(compressor).traits["biased"])

    def compresses(self, param: torch.Tensor) -> bool:
        return param.dim() > 1 and param.numel() >= self.layer_min_size

    def key(self, param: torch.Tensor):
        return self._names.get(id(param), id(param))

    def __getstate__(self):
        if any(not isinstance(k, str) for k in list(self.residuals) + list(self.momenta)):
            raise ValueError(
                "CompressionState keys its residuals by parameter identity, which does not "
                "survive a restart: create it with module=model to checkpoint them"
            )
        return {
            "compressor": self.compressor,
            "params": self.params,
            "error_feedback": self.error_feedback,
            "layer_min_size": self.layer_min_size,
            "momentum": self.momentum,
            "residuals": {k: v.clone() for k, v in self.residuals.items()},
            "momenta": {k: v.clone() for k, v in self.momenta.items()},
            "steps": self.steps,
            "plan": self.plan,
        }

    def __setstate__(self, state):
        self.process_group = None  # set it again after loading, as for PyTorch's states
        self.compressor, self.params = state["compressor"], state["params"]
        self.error_feedback, self.layer_min_size = state["error_feedback"], state["layer_min_size"]
        self.momentum = state["momentum"]
        self.residuals = dict(state["residuals"])
        self.momenta = dict(state["momenta"])
        self.steps = state.get("steps", 0)
        self.plan = state.get("plan")
        self._names = {}

    def attach(self, module: torch.nn.Module, process_group=None) -> None:
        """After ``__setstate__``: the model whose parameter names key the residuals, and the
        group (None: the default)."""
        self._names = {id(p): name for name, p in module.named_parameters()}
        self.process_group = process_group

    def native_config(self, stream: int = -1):
        """The backend settings of a compressed call; ``stream`` numbers its random streams
        (-1: the group's call counter)."""
        group = get_config(self.process_group)
        if self.compressor == "maxmin":
            fields = {k: v for k, v in self.params.items() if k in _MAXMIN_FIELDS}
            fields = {k: bool(v) if k in ("skip_incomplete_buckets", "stochastic") else int(v)
                      for k, v in fields.items()}  # fmt: skip
            group = group.replace(compressor="maxmin", compressor_params="", **fields)
        else:
            group = group.replace(compressor=self.compressor, compressor_params=self.params)
        native = group.to_native()
        native.stream = stream
        return native


def _stage(buf: torch.Tensor, spans: List[tuple], whole: bool) -> torch.Tensor:
    return buf if whole else torch.cat([buf[o : o + n] for o, n, _ in spans])


_SPARSE = ("topk", "randomk", "threshold", "dgc", "graddrop")


def _add_memory(state: CompressionState, tensor: torch.Tensor, spans: List[tuple]) -> None:
    """In place on the staged gradients: u = m * u + g replaces g (momentum), then the residual
    is added (error feedback)."""
    pos = 0
    for _, n, p in spans:
        part = tensor[pos : pos + n]
        if state.momentum > 0:
            u = state.momenta.get(state.key(p))
            if u is None or u.numel() != n:
                u = state.momenta[state.key(p)] = torch.zeros(n, dtype=torch.float32)
            u.mul_(state.momentum).add_(part.float())
            part.copy_(u)
        old = state.residuals.get(state.key(p)) if state.error_feedback else None
        if old is not None and old.numel() == n:
            part += old.to(part.dtype)
        pos += n


# torch.load(weights_only=True), torch's default, accepts the state (plain data and tensors).
torch.serialization.add_safe_globals([CompressionState])


def _planned(backend, config, numel: int):
    """The group plan's settings for a call of ``numel`` values (csrc/torch/plan_rules.cc)."""
    if not backend.plan():
        raise ValueError(
            "CompressionState(plan='auto') needs a planned group: create it with "
            "CGX_COMPRESSOR=auto or call torch_cgx.set_config(compressor='auto') first"
        )
    return backend.planned_config(config, numel)


def compression_hook(
    state: CompressionState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket: compressible layers with the state's compressor (and error feedback),
    the rest exactly."""
    backend = cgx_backend(state.process_group)
    buf = bucket.buffer()
    comp, exact = bucket_spans(state, bucket)
    futures, staged = [], []
    if comp:
        tensor = _stage(buf, comp, not exact)
        _add_memory(state, tensor, comp)
        residual = None
        if state.error_feedback:
            residual = torch.empty(tensor.numel(), dtype=torch.float32)
        config = state.native_config(call_stream(state, bucket, comp[0][2]))
        if state.plan == "auto":
            config = _planned(backend, config, tensor.numel())
        futures.append(backend.allreduce_with(tensor, config, True, residual))
        staged.append((tensor, comp, residual))
    if exact:
        tensor = _stage(buf, exact, not comp)
        futures.append(backend.allreduce_with(tensor, exact_config(state.process_group), True))
        staged.append((tensor, exact, None))
    futures = [w.get_future() for w in futures]
    if bucket.is_last():
        state.steps += 1

    def finish(fut):
        settled(fut)
        for tensor, spans, residual in staged:
            pos = 0
            for o, n, p in spans:
                if tensor is not buf:
                    buf[o : o + n].copy_(tensor[pos : pos + n])
                if residual is not None:
                    state.residuals[state.key(p)] = residual[pos : pos + n]
                    u = state.momenta.get(state.key(p))
                    if u is not None and state.compressor in _SPARSE:
                        u.masked_fill_(residual[pos : pos + n] == 0, 0.0)  # sent: masked
                pos += n
        return buf

    if len(futures) == 1:
        return futures[0].then(finish)
    return torch.futures.collect_all(futures).then(finish)
