"""Compression objects as the gradient policy of a DDP model on a cgx group.

>>> state = PolicyState(model, SizeAdaptiveCompression(2**16, NoCompression(),
...                                                    Uniform8BitQuantization()))
>>> ddp.register_comm_hook(state, policy_hook)

For every parameter the policy is asked once, with ``CompressionInfo(key=<parameter name>,
descriptor=<its shape and dtype>, role=TensorRole.GRADIENT)``, which object compresses its
gradient; the object's ``allreduce_codec()`` gives the cgx backend's compressed allreduce that
carries it (NoCompression: exact; Float16Compression: ``fp16``; Uniform8BitQuantization and
BlockwiseQuantization: max-min with 8 bits; CGXCompression: its compressor). Objects without one
(ScaledFloat16Compression, Quantile8BitQuantization) raise ValueError here.

Each DDP gradient bucket is split by choice: the gradients with the same compressor are
concatenated and averaged in one call, as :func:`torch_cgx.hooks.compression_hook` makes it
(the hook core, torch_cgx/hooks/core.py), with one :class:`~torch_cgx.hooks.CompressionState`
per compressor (error feedback and momentum as there: by default on for biased compressors,
max-min included; ``error_feedback=False`` turns it off). Unlike ``CompressionState`` alone, the
policy decides for every parameter, vectors and small ones included: there is no ``min_size``.
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations at run time.
from typing import Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

from torch_cgx.compression.adaptive import resolve
from torch_cgx.compression.base import (
    CompressionBase,
    CompressionInfo,
    TensorDescriptor,
    TensorRole,
    role_name,
)
from torch_cgx.hooks import core
from torch_cgx.hooks.compression import CompressionState, compressed_parts
from torch_cgx.settings import min_size_default

__all__ = ["PolicyState", "policy_hook", "register_policy"]

_EXACT = ("exact", ())


class _ChoiceState(CompressionState):
    """A CompressionState for the gradients that one choice covers: all of them are compressed
    (or none, for the exact choice): the policy has already filtered."""

    __slots__ = ("exact",)

    def compresses(self, param: torch.Tensor) -> bool:
        return not self.exact


def _codec_key(choice: CompressionBase) -> Tuple[str, tuple]:
    codec = choice.allreduce_codec()  # ValueError for objects without an allreduce
    if codec is None:
        return _EXACT
    name, params = codec
    return name, tuple(sorted((k, float(v)) for k, v in params.items()))


def _key_name(key: Tuple[str, tuple]) -> str:
    name, params = key
    return name + "(" + ",".join(f"{k}={v:g}" for k, v in params) + ")"


class PolicyState:
    """State of :func:`policy_hook`.

    Args:
        module: the model (or its DDP wrapper): its parameter names are the policy's keys.
        policy: a torch_cgx.compression object (a policy or a single compression).
        process_group: a cgx group (None: the default group).
        error_feedback: passed to each codec's CompressionState (None: on for biased ones).
        role: the role the policy is asked about (default: gradients).
    """

    __slots__ = ("process_group", "policy", "choices", "states", "_by_param", "_layouts")

    def __init__(
        self,
        module: torch.nn.Module,
        policy: CompressionBase,
        process_group: Optional[dist.ProcessGroup] = None,
        error_feedback: Optional[bool] = None,
        role=TensorRole.GRADIENT,
    ) -> None:
        if not isinstance(module, torch.nn.Module):
            raise ValueError(f"module must be a torch.nn.Module, got {type(module).__name__}")
        if isinstance(module, torch.nn.parallel.DistributedDataParallel):
            module = module.module
        role_name(role)  # ValueError for an unknown role
        self.process_group, self.policy = process_group, policy
        self.choices: Dict[str, CompressionBase] = {}  # parameter name -> compression object
        self.states: Dict[Tuple[str, tuple], CompressionState] = {}  # codec -> its state
        self._by_param: Dict[int, CompressionState] = {}
        self._layouts: Dict = {}  # gradient bucket -> its spans per choice (core.cached_layout)
        for name, p in module.named_parameters():
            info = CompressionInfo(name, TensorDescriptor(tuple(p.shape), p.dtype), role)
            choice = self.choices[name] = resolve(policy, info)
            key = _codec_key(choice)
            if key not in self.states:
                self.states[key] = self._new_state(key, module, error_feedback)
            self._by_param[id(p)] = self.states[key]

    def _new_state(self, key, module, error_feedback) -> CompressionState:
        name, params = key
        if key == _EXACT:  # never compresses (compresses() is False): the name is unused
            state = _ChoiceState(self.process_group, "fp16", error_feedback=False, module=module)
        else:
            min_size = min_size_default("policy_hook")  # the policy decides for every parameter
            state = _ChoiceState(self.process_group, name, dict(params), error_feedback,
                                 min_size=min_size, module=module)  # fmt: skip
        state.exact = key == _EXACT
        return state

    def state_dict(self) -> Dict[str, dict]:
        """Every codec's memory (residuals, momenta, step count) keyed by codec, plain data and
        tensors: ``torch.save`` it (``weights_only=True`` loads it) and give it to
        :meth:`load_state_dict` of a PolicyState made with the same model and policy."""
        return {_key_name(k): s.__getstate__() for k, s in self.states.items()}

    def load_state_dict(self, saved: Dict[str, dict]) -> None:
        missing = sorted(set(map(_key_name, self.states)) - set(saved))
        if missing:
            raise ValueError(f"the saved policy state has no memory for codec(s) {missing}")
        for key, sub in self.states.items():
            names, group = sub._names, sub.process_group
            sub.__setstate__(saved[_key_name(key)])
            sub._names, sub.process_group = names, group

    def __getstate__(self):
        raise ValueError(
            "a PolicyState holds compressor objects that do not pickle: save "
            "state.state_dict() and restore it with load_state_dict on a new PolicyState"
        )

    def codec_of(self, name: str) -> Optional[Tuple[str, Dict[str, float]]]:
        """The (compressor, parameters) that carries parameter ``name``'s gradient (None:
        exact)."""
        return self.choices[name].allreduce_codec()

    def split(self, params) -> Dict[CompressionState, List[tuple]]:
        """The (offset, numel, param) spans of a gradient bucket's ``params``, per choice."""
        groups: Dict[CompressionState, List[tuple]] = {}
        offset = 0
        for p in params:
            groups.setdefault(self.state_of(p), []).append((offset, p.numel(), p))
            offset += p.numel()
        return groups

    def state_of(self, param: torch.Tensor) -> CompressionState:
        if id(param) not in self._by_param:
            raise ValueError("a parameter of the DDP bucket is not in the PolicyState's module")
        return self._by_param[id(param)]


def policy_hook(state: PolicyState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the gradient bucket: the gradients of each choice of the policy in one
    compressed call."""
    grad_bucket = bucket  # DDP's name for the argument; the quantizer's bucket is bucket_size
    buf = grad_bucket.buffer()
    groups = core.cached_layout(state._layouts, grad_bucket, state.split)
    parts, backend = [], None
    for sub, spans in groups.items():
        backend = sub._calls.refresh(sub.process_group)  # every choice's: the state's group
        comp, exact = ([], spans) if sub.exact else (spans, [])
        parts += compressed_parts(sub, backend, grad_bucket, buf, comp, exact, len(groups) == 1)
    if grad_bucket.is_last():
        for sub in state.states.values():
            sub.steps += 1  # every choice's streams are numbered one per step, called or not
    return core.reduce_bucket(backend, buf, parts)


def register_policy(
    ddp: torch.nn.parallel.DistributedDataParallel,
    policy: CompressionBase,
    process_group: Optional[dist.ProcessGroup] = None,
    error_feedback: Optional[bool] = None,
) -> PolicyState:
    """``ddp.register_comm_hook(PolicyState(ddp, policy, ...), policy_hook)``; returns the
    state."""
    state = PolicyState(ddp, policy, process_group, error_feedback)
    ddp.register_comm_hook(state, policy_hook)
    return state
