"""The per-layer state every layer-filtering hook state shares (``CGXState``,
``CompressionState``): which parameters are compressed, residuals keyed by parameter name,
the step count, the cached native call options and gradient-bucket layouts (hooks/core.py)."""

from __future__ import annotations

from typing import Dict, List, Tuple

import torch

from torch_cgx.hooks.core import NativeCalls, Span, cached_layout, grad_spans

__all__ = ["LayerState"]


class LayerState:
    """What the layer-filtering states share: the group, the minimum size, residuals and
    names. A parameter is compressed when it is a matrix or more (``dim() > 1``: biases and
    norms stay exact) of at least ``min_size`` values. Residuals are keyed by parameter name
    (with ``module=``) or identity, never by gradient bucket, so they survive DDP's rebuild of
    its gradient buckets after the first step."""

    __slots__ = ("process_group", "min_size", "residuals", "steps", "_names", "_calls",
                 "_layouts")  # fmt: skip

    def _init_layers(self, process_group, min_size: int, module) -> None:
        self.process_group, self.min_size = process_group, min_size
        self.residuals: Dict = {}
        self.steps = 0  # DDP steps seen: numbers the random streams
        self._names: Dict[int, str] = {}
        self._calls = NativeCalls()
        self._layouts: Dict = {}  # gradient bucket -> its spans (cached_layout)
        if module is not None:
            self._names = {id(p): name for name, p in module.named_parameters()}

    @property
    def layer_min_size(self) -> int:
        """CGX's name of :attr:`min_size`."""
        return self.min_size

    def compresses(self, param: torch.Tensor) -> bool:
        return param.dim() > 1 and param.numel() >= self.min_size

    def spans(self, grad_bucket) -> Tuple[List[Span], List[Span]]:
        """:func:`grad_spans` of the gradient bucket, computed once per set of parameters (and
        minimum size)."""
        cache = self._layouts.setdefault(self.min_size, {})
        return cached_layout(cache, grad_bucket, lambda params: grad_spans(self.compresses, params))

    def key(self, param: torch.Tensor):
        return self._names.get(id(param), id(param))

    def attach(self, module: torch.nn.Module, process_group=None) -> None:
        """After ``__setstate__``: the model whose parameter names key the residuals, and the
        group (None: the default)."""
        self._names = {id(p): name for name, p in module.named_parameters()}
        self.process_group = process_group

    def keep(self, param: torch.Tensor, residual: torch.Tensor) -> None:
        self.residuals[self.key(param)] = residual

    def residual(self, param: torch.Tensor, numel: int):
        """The residual kept for ``param``, or None (none yet, or a layer that changed size)."""
        r = self.residuals.get(self.key(param))
        return r if r is not None and r.numel() == numel else None

    def _check_keys(self, *tables) -> None:
        if any(not isinstance(k, str) for table in (self.residuals,) + tables for k in table):
            raise ValueError(
                f"{type(self).__name__} keys its residuals by parameter identity, which does not "
                "survive a restart: create it with module=model to checkpoint them"
            )

    def _restore_layers(self, state: dict) -> None:
        # The process group cannot be pickled; it is set again after loading (PyTorch's habit).
        self.process_group = None
        # "layer_min_size": deprecated key of states saved by earlier torch_cgx versions.
        self.min_size = state["min_size"] if "min_size" in state else state["layer_min_size"]
        self.residuals = dict(state.get("residuals", {}))
        self.steps = state.get("steps", 0)
        self._names, self._calls, self._layouts = {}, NativeCalls(), {}
