"""A DDP communication hook for any registered compressor, with error feedback.

``model.register_comm_hook(CompressionState(compressor="topk", params={"ratio": 0.01},
module=model), compression_hook)``. Layers are filtered as in :class:`torch_cgx.CGXState`:
parameters with ``dim() <= 1`` or fewer than ``min_size`` values are averaged exactly, the
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

from torch_cgx import _C, compressors
from torch_cgx.backend import get_config
from torch_cgx.config import CGXConfig
from torch_cgx.hooks import core
from torch_cgx.hooks.layer_state import LayerState
from torch_cgx.settings import min_size_default

__all__ = ["CompressionState", "compression_hook"]

_MAXMIN_FIELDS = ("bits", "bucket_size", "skip_incomplete_buckets", "stochastic")
# Max-min's bits when the state is not told (the table of every preset's defaults:
# docs/hooks.md); the other fields come from the group's settings.
DEFAULT_BITS = 4
# Per compressor, the hook's defaults where the published method differs from the general ones.
# signsgd decodes to +-1 whatever the gradient's scale, so a residual x - sign(x) is not a
# compression error to feed back (GRACE pairs it with no memory; efsignsgd is the scaled,
# error-feedback variant).
_DEFAULTS = {
    "signsgd": {"error_feedback": False},
    "signum": {"momentum": 0.9, "error_feedback": False},
    "dgc": {"momentum": 0.9},
}
_SPARSE = ("topk", "randomk", "threshold", "dgc", "graddrop")


class CompressionState(LayerState):
    """State of :func:`compression_hook`.

    Args:
        process_group: a group created with backend ``cgx`` (None: the default group).
        compressor: a name of ``torch_cgx.compressors.names()``.
        params: the compressor's parameters (``compressors.params(name)``); for ``maxmin``:
            ``bits`` (default 4), ``bucket_size``, ``skip_incomplete_buckets``, ``stochastic``.
        error_feedback: keep residuals; None (default): for biased compressors only (signsgd and
            signum: off).
        min_size: parameters with fewer values (or ``dim() <= 1``) are reduced exactly (default
            1024).
        layer_min_size: deprecated alias of ``min_size`` (no compatibility target uses it
            here; CGX's name belongs to ``CGXState``): use ``min_size``.
        module: the model, to key residuals by parameter name (needed to checkpoint them).
        momentum: keep ``u = m * u + g`` and compress it (DGC, Signum); None: 0.9 for ``signum``
            and ``dgc``, else 0.
        plan: ``"auto"``: the group's plan (a group created with ``CGX_COMPRESSOR=auto`` or
            after ``set_config(compressor="auto")``) chooses per call, by the size of the
            bucket's compressible part, exact or how to compress; ``compressor`` and ``params``
            are then unused. Error feedback (on by default) covers what the plan compressed.

    The group's settings are read and the native call options built once per version of them
    (``set_config`` makes a new version), never per gradient bucket.
    """

    __slots__ = ("compressor", "params", "error_feedback", "momentum", "momenta", "plan")

    def __init__(
        self,
        process_group: Optional[dist.ProcessGroup] = None,
        compressor: str = "maxmin",
        params: Optional[Dict[str, Any]] = None,
        error_feedback: Optional[bool] = None,
        min_size: Optional[int] = None,
        module: Optional[torch.nn.Module] = None,
        momentum: Optional[float] = None,
        plan: Optional[str] = None,
        *,
        layer_min_size: Optional[int] = None,
    ) -> None:
        if plan not in (None, "auto"):
            raise ValueError(f"plan must be None or 'auto', got {plan!r}")
        params = dict(params or {})
        if compressor == "maxmin":
            params.setdefault("bits", DEFAULT_BITS)
        traits = compressors.get(compressor, **params).traits  # ValueError names the problem
        min_size = core.check_min_size(
            min_size, layer_min_size, "layer_min_size", min_size_default("hooks")
        )
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
        self._init_layers(process_group, min_size, module)
        self.compressor, self.params = compressor, params
        self.error_feedback = error_feedback
        self.momentum = float(momentum)
        self.momenta: Dict[Any, torch.Tensor] = {}
        self.plan = plan

    @staticmethod
    def default_error_feedback(compressor: str) -> bool:
        """Whether a state for ``compressor`` keeps residuals when ``error_feedback`` is None:
        biased compressors do (default parameters), except signum (its momentum plays the part).
        """
        defaults = _DEFAULTS.get(compressor, {})
        return defaults.get("error_feedback", compressors.get(compressor).traits["biased"])

    def __getstate__(self):
        self._check_keys(self.momenta)
        return {
            "compressor": self.compressor,
            "params": self.params,
            "error_feedback": self.error_feedback,
            "min_size": self.min_size,
            "momentum": self.momentum,
            "residuals": {k: v.clone() for k, v in self.residuals.items()},
            "momenta": {k: v.clone() for k, v in self.momenta.items()},
            "steps": self.steps,
            "plan": self.plan,
        }

    def __setstate__(self, state):
        self._restore_layers(state)  # "layer_min_size": a state saved before the rename
        self.compressor, self.params = state["compressor"], state["params"]
        self.error_feedback = state["error_feedback"]
        self.momentum = state["momentum"]
        self.momenta = dict(state["momenta"])
        self.plan = state.get("plan")

    def settings(self, group: CGXConfig) -> CGXConfig:
        """The settings of a compressed call, from the group's."""
        if self.compressor == "maxmin":
            fields = {k: v for k, v in self.params.items() if k in _MAXMIN_FIELDS}
            fields = {k: bool(v) if k in ("skip_incomplete_buckets", "stochastic") else int(v)
                      for k, v in fields.items()}  # fmt: skip
            return group.replace(compressor="maxmin", compressor_params="", **fields)
        return group.replace(compressor=self.compressor, compressor_params=self.params)

    def native_config(self, stream: int = -1):
        """The native settings (``_C.BackendConfig``) of a compressed call; ``stream`` numbers
        its random streams (-1: the group's call counter). Built afresh: the hook reuses
        native options instead."""
        native = self.settings(get_config(self.process_group)).to_native()
        native.stream = stream
        return native

    def keep(self, param: torch.Tensor, residual: torch.Tensor) -> None:
        """The new residual of ``param``; with a sparse compressor its momentum is zeroed
        where a value was sent (DGC's momentum factor masking: the residual is exactly 0)."""
        self.residuals[self.key(param)] = residual
        u = self.momenta.get(self.key(param))
        if u is not None and self.compressor in _SPARSE:
            u.masked_fill_(residual == 0, 0.0)


# torch.load(weights_only=True), torch's default, accepts the state (plain data and tensors).
torch.serialization.add_safe_globals([CompressionState])


def _apply_momentum(state: CompressionState, buf: torch.Tensor, spans: List[tuple]) -> None:
    """u = m * u + g replaces g in the buffer (its compressed spans are overwritten by the
    result anyway), before staging adds the residuals."""
    for o, n, p in spans:
        u = state.momenta.get(state.key(p))
        if u is None or u.numel() != n:
            u = state.momenta[state.key(p)] = torch.zeros(n, dtype=torch.float32, device=buf.device)
        part = buf[o : o + n]
        u.mul_(state.momentum).add_(part.float())
        part.copy_(u)


def _planned(state: CompressionState, backend, numel: int) -> _C.CallOptions:
    """The options the group's plan gives a call of ``numel`` values (csrc/torch/plan_rules.cc),
    built once per size and version of the group's settings and plan."""
    if not backend.plan():
        raise ValueError(
            "CompressionState(plan='auto') needs a planned group: create it with "
            "CGX_COMPRESSOR=auto or call torch_cgx.set_config(compressor='auto') first"
        )

    def build(group: CGXConfig) -> _C.CallOptions:
        return _C.CallOptions(backend.planned_config(state.settings(group).to_native(), numel))

    return state._calls.cached(("plan", numel), build)


def compressed_parts(state: CompressionState, backend, grad_bucket, buf, comp, exact, whole):
    """The parts of ``state``'s reduction over the spans of ``buf``: the compressed ``comp``
    (momentum applied now, error feedback), the exact ``exact``; ``whole``: they are all of
    ``buf``."""
    parts = []
    if comp:
        if state.momentum > 0:
            _apply_momentum(state, buf, comp)
        feedback = state.error_feedback
        if state.plan == "auto":
            options = _planned(state, backend, sum(n for _, n, _ in comp))
        else:
            options = state._calls.options("compressed", state.settings)
        parts.append(core.Part(
            options, comp, stream=core.call_stream(state, grad_bucket, comp[0][2]),
            residuals=[state.residual(p, n) for _, n, p in comp] if feedback else None,
            whole=whole and not exact, keep=state.keep if feedback else None,
        ))  # fmt: skip
    if exact:
        parts.append(core.Part(state._calls.exact(), exact, whole=whole and not comp))
    return parts


def compression_hook(
    state: CompressionState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Averages the gradient bucket: compressible layers with the state's compressor (and error
    feedback), the rest exactly."""
    grad_bucket = bucket  # DDP's name for the argument; the quantizer's bucket is bucket_size
    backend = state._calls.refresh(state.process_group)
    buf = grad_bucket.buffer()
    comp, exact = state.spans(grad_bucket)
    parts = compressed_parts(state, backend, grad_bucket, buf, comp, exact, True)
    if grad_bucket.is_last():
        state.steps += 1
    return core.reduce_bucket(backend, buf, parts)
