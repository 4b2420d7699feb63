"""CGX's layer-wise DDP communication hook: ``model.register_comm_hook(CGXState(...), cgx_hook)``.

Each call reads the layout of the bucket it reduces from ``bucket.parameters()``: parameters
with ``dim() <= 1`` (biases, norms) or fewer than ``layer_min_size`` elements are reduced exactly;
the others are reduced with max-min at the state's bits and bucket size. Nothing is keyed by call
order, so allreduce calls outside DDP, several DDP models and subgroups keep working. The hook
averages (DDP's convention).

Accuracy levers (docs/accuracy.md; defaults per bit width in ``DEFAULT_LEVERS``): buckets that
never straddle two layers, error feedback, stochastic rounding, a seeded rotation per bucket, and
adaptive bits per layer under a budget. ``CGXState(compression_params={"bits": b})`` gets the
measured best combination for ``b``; ``legacy=True`` is CGX's own hook (layers concatenated, no
error feedback, no rotation).
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations at run time.
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from torch_cgx.backend import cgx_backend, get_config
from torch_cgx.config import CGXConfig
from torch_cgx.hooks import levers
from torch_cgx.hooks._reduce import (
    bucket_spans,
    call_stream,
    exact_allreduce,
    exact_config,
    settled,
)

__all__ = ["CGXState", "cgx_hook", "DEFAULT_LEVERS"]

# The levers a state uses when it is not told, per bit width (measured: docs/accuracy.md).
# Error feedback is off: with AdamW it cost accuracy at every width measured (turn it on for
# SGD at 1 bit, where it keeps training from diverging).
DEFAULT_LEVERS = {
    b: {
        "split_layers": True,
        "error_feedback": False,
        "rotation": b <= 4,
        "mean_levels": b == 1,
    }  # fmt: skip
    for b in range(1, 9)
}
# Clipping follows the rotation unless given: it suits rotated (near-Gaussian) buckets only.
_LEVERS = ("split_layers", "error_feedback", "rotation", "mean_levels", "clip")


class CGXState:
    """State of :func:`cgx_hook`.

    Args:
        process_group: a group created with backend ``cgx`` (None: the default group).
        layer_min_size: parameters with fewer elements are reduced exactly (CGX default 1024).
        compression_params: ``{"bits": 1..8 or 32, "bucket_size": >= 1}``, optionally
            ``"stochastic": bool``; missing keys take the group's settings (``CGX_*`` variables).
        split_layers: every layer starts a new bucket (no bucket straddles two layers).
        error_feedback: keep what each compression left out per layer and add it to the next
            gradient (one fp32 value per compressed gradient value).
        rotation: seeded sign flips + Walsh-Hadamard per bucket before quantizing (the bucket
            size must then be a power of two).
        mean_levels: at 1 bit, a bucket's two levels are the means of its negative and of its
            non-negative values (onebit's payload, the same size) instead of its min and max.
        clip: each bucket's range narrowed to the Gaussian-optimal one for its bits (mean +- a
            multiple of its standard deviation; values beyond decode to the nearest end), in both
            quantizations of SRA. None: on where ``rotation`` is (rotated buckets are
            near-Gaussian).
        stochastic: stochastic rounding (also ``compression_params["stochastic"]``; None and
            absent there: the group's setting).
        adaptive_bits: an average number of code bits per compressed value (1..8): every
            ``adapt_every`` steps the layers' errors are measured, summed over the ranks, and
            bits per layer chosen to minimise the total error within that budget. Needs
            ``module``.
        module: the model, to key residuals and per-layer bits by parameter name (needed to
            checkpoint them).
        legacy: CGX's hook exactly (levers off unless given).
        None for a lever: ``DEFAULT_LEVERS`` at the call's bit width.
    """

    __slots__ = ("process_group", "layer_min_size", "compression_params", "levers", "legacy",
                 "adaptive_bits", "adapt_every", "residuals", "layer_bits", "steps", "_names",
                 "_energy")  # fmt: skip

    def __init__(
        self,
        process_group: Optional[dist.ProcessGroup] = None,
        layer_min_size: int = 1024,
        compression_params: Optional[Dict[str, Any]] = None,
        *,
        split_layers: Optional[bool] = None,
        error_feedback: Optional[bool] = None,
        rotation: Optional[bool] = None,
        mean_levels: Optional[bool] = None,
        clip: Optional[bool] = None,
        stochastic: Optional[bool] = None,
        adaptive_bits: Optional[float] = None,
        adapt_every: int = 50,
        module: Optional[torch.nn.Module] = None,
        legacy: bool = False,
    ) -> None:
        if not isinstance(layer_min_size, int) or layer_min_size < 0:
            raise ValueError(f"layer_min_size must be an integer >= 0, got {layer_min_size!r}")
        params = dict(compression_params or {})
        unknown = set(params) - {"bits", "bucket_size", "stochastic"}
        if unknown:
            raise ValueError(f"unknown compression_params key(s): {sorted(unknown)}")
        CGXConfig(**params)  # validates bits / bucket_size / stochastic
        if stochastic is None and "stochastic" in params:  # CGX's way of asking
            stochastic = bool(params["stochastic"])  # validated by CGXConfig above
        elif stochastic is not None and params.get("stochastic", stochastic) != stochastic:
            raise ValueError("stochastic and compression_params['stochastic'] differ")
        given = {"split_layers": split_layers, "error_feedback": error_feedback,
                 "rotation": rotation, "mean_levels": mean_levels, "clip": clip,
                 "stochastic": stochastic}  # fmt: skip
        for name, value in given.items():
            if value is not None and not isinstance(value, bool):
                raise ValueError(f"{name} must be a bool or None, got {value!r}")
        if params.get("bucket_size") is not None and rotation:
            _check_rotation_block(params["bucket_size"])
        if adaptive_bits is not None:
            if isinstance(adaptive_bits, bool) or not isinstance(adaptive_bits, (int, float)):
                raise ValueError(f"adaptive_bits must be a number in [1, 8], got {adaptive_bits!r}")
            if not levers.MIN_BITS <= adaptive_bits <= levers.MAX_BITS:
                raise ValueError(f"adaptive_bits must be in [1, 8], got {adaptive_bits!r}")
            if module is None:
                raise ValueError("adaptive_bits needs module=model (bits are kept per layer name)")
            if split_layers is False:
                raise ValueError("adaptive_bits needs split_layers (bits are chosen per layer)")
        if not isinstance(adapt_every, int) or isinstance(adapt_every, bool) or adapt_every < 1:
            raise ValueError(f"adapt_every must be an integer >= 1, got {adapt_every!r}")
        self.process_group = process_group
        self.layer_min_size = layer_min_size
        self.compression_params = params
        self.levers = {k: v for k, v in given.items() if v is not None}
        self.legacy = bool(legacy)
        self.adaptive_bits = None if adaptive_bits is None else float(adaptive_bits)
        self.adapt_every = adapt_every
        self.residuals: Dict[Any, torch.Tensor] = {}
        self.layer_bits: Dict[str, int] = {}
        self.steps = 0
        self._energy: Dict[str, float] = {}
        self._names = {}
        if module is not None:
            self.attach(module, process_group)

    def resolved(self, bits: int, stochastic: bool = False) -> Dict[str, bool]:
        """The levers of a call at ``bits``: the given ones, the rest from ``DEFAULT_LEVERS``
        (all off with ``legacy``); rounding, unless given, is the group's (``stochastic``)."""
        base = dict.fromkeys(_LEVERS, False) if self.legacy else dict(DEFAULT_LEVERS[bits])
        base["stochastic"] = stochastic
        base.update(self.levers)
        base.setdefault("clip", base["rotation"])
        if self.adaptive_bits is not None:
            base["split_layers"] = True
        return base

    def compresses(self, param: torch.Tensor) -> bool:
        return param.dim() > 1 and param.numel() >= self.layer_min_size

    def key(self, param: torch.Tensor):
        return self._names.get(id(param), id(param))

    def attach(self, module: torch.nn.Module, process_group=None) -> None:
        """The model whose parameter names key the residuals and bits (after ``__setstate__``),
        and the group (None: the default)."""
        self._names = {id(p): name for name, p in module.named_parameters()}
        self.process_group = process_group

    def __getstate__(self):
        # The process group cannot be pickled; it is set again after loading (PyTorch's habit).
        if any(not isinstance(k, str) for k in self.residuals):
            raise ValueError(
                "CGXState keys its residuals by parameter identity, which does not survive a "
                "restart: create it with module=model to checkpoint them"
            )
        return {
            "layer_min_size": self.layer_min_size,
            "compression_params": self.compression_params,
            "levers": dict(self.levers),
            "legacy": self.legacy,
            "adaptive_bits": self.adaptive_bits,
            "adapt_every": self.adapt_every,
            "residuals": {k: v.clone() for k, v in self.residuals.items()},
            "layer_bits": dict(self.layer_bits),
            "steps": self.steps,
        }

    def __setstate__(self, state):
        self.process_group = None
        self.layer_min_size = state["layer_min_size"]
        self.compression_params = state["compression_params"]
        # States saved before the levers existed are CGX's hook: keep what they did.
        self.levers = state.get("levers", {})
        self.legacy = state.get("legacy", "levers" not in state)
        self.adaptive_bits = state.get("adaptive_bits")
        self.adapt_every = state.get("adapt_every", 50)
        self.residuals = dict(state.get("residuals", {}))
        self.layer_bits = dict(state.get("layer_bits", {}))
        self.steps = state.get("steps", 0)
        self._energy, self._names = {}, {}


# torch.load(weights_only=True), torch's default, accepts the state (plain data and tensors).
torch.serialization.add_safe_globals([CGXState])


def _check_rotation_block(bucket: int) -> None:
    if not levers.valid_rotation_block(bucket):
        raise ValueError(
            f"rotation needs a bucket_size that is a power of two in [2, 2^20], got {bucket}"
        )


def _stage(buf, spans, whole: bool, bucket: int, split: bool, dtype, residuals, seeds):
    """The tensor one call reduces: ``buf`` itself when the call covers the whole bucket with
    nothing to add, pad or rotate; else a staged copy (levers.stage)."""
    alone = not split or len(spans) == 1  # a lone layer cannot straddle
    if whole and alone and not seeds and not any(r is not None for r in residuals):
        return levers.Staged(buf, spans, [0], [buf.numel()], [])
    return levers.stage(buf, spans, bucket, split, dtype, residuals, seeds)


def _compress(state, backend, base: CGXConfig, buf, comp, use, stream, whole, measure):
    """Issues the compressed calls of ``comp`` (one per bit width); returns (work, Staged)."""
    groups: Dict[int, List[tuple]] = {}
    for span in comp:
        groups.setdefault(state.layer_bits.get(state.key(span[2]), base.bits), []).append(span)
    bucket = base.bucket_size
    if use["rotation"]:
        _check_rotation_block(bucket)
    seed_of = {id(p): levers.rotation_seed(stream, j) for j, (_, _, p) in enumerate(comp)}
    # fp32 staging where residuals are added or values rotated.
    dtype = torch.float32 if use["error_feedback"] or use["rotation"] else buf.dtype
    split = use["split_layers"]
    calls = []
    for bits, spans in sorted(groups.items()):
        residuals = [_residual(state, p, n) if use["error_feedback"] else None
                     for _, n, p in spans]  # fmt: skip
        seeds = [seed_of[id(p)] for _, _, p in spans] if use["rotation"] else []
        one_call = whole and len(groups) == 1
        staged = _stage(buf, spans, one_call, bucket, split, dtype, residuals, seeds)
        if measure:
            energy_of = levers.spread_energy if use["clip"] else levers.range_energy
            for (_, n, p), start, size in zip(spans, staged.starts, staged.sizes):
                energy = energy_of(staged.tensor, start, size, bucket)
                state._energy[state.key(p)] = (energy, n)
        if use["error_feedback"]:
            staged.residual = torch.empty(staged.tensor.numel(), dtype=torch.float32)
        if bits == 1 and use["mean_levels"]:
            one = {"compressor": "onebit", "compressor_params": {"bucket_size": bucket}}
            config = base.replace(**one).to_native()
        else:
            clip = "on" if use["clip"] else "off"
            config = base.replace(bits=bits, stochastic=use["stochastic"], clip=clip).to_native()
        config.stream = stream
        calls.append((backend.allreduce_with(staged.tensor, config, True, staged.residual), staged))
    return calls


def _residual(state: CGXState, param, numel: int):
    """The residual kept for ``param``, or None (none yet, or a layer that changed size)."""
    r = state.residuals.get(state.key(param))
    return r if r is not None and r.numel() == numel else None


def _adapt(
    state: CGXState, keys: List[str], energies: torch.Tensor, sizes: List[int], clipped: bool
) -> None:
    """Every rank: bits per layer from the summed energies (identical on every rank)."""
    if not torch.isfinite(energies).all():
        return  # a non-finite step (AMP's skipped steps): keep the current choice
    bits = levers.choose_bits(energies.tolist(), sizes, state.adaptive_bits, clipped)
    state.layer_bits = dict(zip(keys, bits))


def cgx_hook(state: CGXState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the bucket: compressible layers with the state's bits, the rest exactly."""
    backend = cgx_backend(state.process_group)
    # rotation="off": the hook's rotation is its own lever (per layer), never the group's too
    base = get_config(state.process_group).replace(
        compressor="maxmin", compressor_params="", rotation="off"
    )
    base = base.replace(**state.compression_params)
    buf = bucket.buffer()
    comp, exact = bucket_spans(state, bucket)
    if base.bits > 8:  # bits 32: everything exact
        comp, exact = [], comp + exact
    calls = []
    adapt_step = state.adaptive_bits is not None and state.steps % state.adapt_every == 0
    measure = bool(comp) and adapt_step
    if comp:
        use = state.resolved(base.bits, base.stochastic)  # CGX_COMPRESSION_STOCHASTIC
        stream = call_stream(state, bucket, comp[0][2])
        calls = _compress(state, backend, base, buf, comp, use, stream, not exact, measure)
    if exact:
        staged = _stage(buf, exact, not comp, 1, False, buf.dtype, [None] * len(exact), [])
        work = backend.allreduce_with(staged.tensor, exact_config(state.process_group), True)
        calls.append((work, staged))
    futures = [work.get_future() for work, _ in calls]
    adapt = None
    # The last bucket sums what every bucket measured, compressed layers of its own or not.
    if adapt_step and bucket.is_last() and state._energy:
        keys = sorted(state._energy)
        energies = torch.tensor([state._energy[k][0] for k in keys], dtype=torch.float64)
        clipped = state.resolved(base.bits, base.stochastic)["clip"]
        adapt = (keys, energies, [state._energy[k][1] for k in keys], clipped)
        state._energy = {}
        futures.append(exact_allreduce(state.process_group, energies))
    if bucket.is_last():
        state.steps += 1

    def finish(fut):
        settled(fut)
        for _, staged in calls:
            layers = levers.unstage(staged, buf, base.bucket_size)
            for (_, _, p), res in zip(staged.spans, layers):
                state.residuals[state.key(p)] = res
        if adapt is not None:
            _adapt(state, *adapt)
        return buf

    if len(futures) == 1:
        return futures[0].then(finish)
    return torch.futures.collect_all(futures).then(finish)
