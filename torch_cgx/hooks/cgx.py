"""CGX's layer-wise DDP communication hook: ``model.register_comm_hook(CGXState(...), cgx_hook)``.

Each call reads the layout of the gradient bucket (DDP's bucket) it reduces from its
``parameters()``: parameters
with ``dim() <= 1`` (biases, norms) or fewer than ``min_size`` elements are reduced exactly;
the others are reduced with max-min at the state's bits and bucket size. Nothing is keyed by call
order, so allreduce calls outside DDP, several DDP models and subgroups keep working. The hook
averages (DDP's convention).

A preset over the hook core (core.py; every preset's defaults: docs/hooks.md). Accuracy levers
(docs/accuracy.md; defaults per bit width in ``DEFAULT_LEVERS``): buckets that never straddle
two layers, error feedback, stochastic rounding, a seeded rotation per bucket, and
adaptive bits per layer under a budget. ``CGXState(compression_params={"bits": b})`` gets the
measured best combination for ``b``; ``legacy=True`` is CGX's own hook (layers concatenated, no
error feedback, no rotation).
"""

# No `from __future__ import annotations`: DDP checks the hook's annotations at run time.
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist

from torch_cgx.config import CGXConfig
from torch_cgx.hooks import core, levers
from torch_cgx.hooks.layer_state import LayerState
from torch_cgx.settings import ROTATION_BLOCKS_TEXT, min_size_default

__all__ = ["CGXState", "cgx_hook", "DEFAULT_LEVERS"]

# The levers a state uses when it is not told, per bit width (measured: docs/accuracy.md; the
# table of every preset's defaults: docs/hooks.md). Error feedback is off: with AdamW it cost
# accuracy at every width measured (turn it on for SGD at 1 bit, where it keeps training from
# diverging). Rotation (None) and clip (absent) follow the backend's rule for "auto"
# (core.rotation_rule: at 1-4 bits with a power-of-two bucket size; clip where it rotates).
DEFAULT_LEVERS = {
    b: {
        "split_layers": True,
        "error_feedback": False,
        "rotation": None,
        "mean_levels": b == 1,
    }  # fmt: skip
    for b in range(1, 9)
}
_LEVERS = ("split_layers", "error_feedback", "rotation", "mean_levels", "clip")
_DEFAULT_BUCKET_SIZE = CGXConfig.bucket_size  # the group's default, when resolved() is not told


class CGXState(LayerState):
    """State of :func:`cgx_hook`.

    Args:
        process_group: a group created with backend ``cgx`` (None: the default group).
        min_size: parameters with fewer elements are reduced exactly (CGX default 1024).
        layer_min_size: compatibility alias of ``min_size`` for CGX's
            ``CGXState(layer_min_size=...)`` (the original pytorch-cgx ``cgx_utils`` API).
        compression_params: ``{"bits": 1..8 or 32, "bucket_size": >= 1}``, optionally
            ``"stochastic": bool``; missing keys take the group's settings (``CGX_*`` variables).
        split_layers: every layer starts a new bucket (no bucket straddles two layers).
        error_feedback: keep what each compression left out per layer and add it to the next
            gradient (one fp32 value per compressed gradient value).
        rotation: seeded sign flips + Walsh-Hadamard per bucket before quantizing (the bucket
            size must then be a power of two). None: the backend's rule for ``"auto"`` (at 1-4
            bits, with a power-of-two bucket size).
        mean_levels: at 1 bit, a bucket's two levels are the means of its negative and of its
            non-negative values (onebit's payload, the same size) instead of its min and max.
        clip: each bucket's range narrowed to the Gaussian-optimal one for its bits (mean +- a
            multiple of its standard deviation; values beyond decode to the nearest end), in both
            quantizations of SRA. None: on where the call rotates (rotated buckets are
            near-Gaussian).
        stochastic: stochastic rounding (also ``compression_params["stochastic"]``; None and
            absent there: the group's setting).
        adaptive_bits: an average number of code bits per compressed value (1..8): every
            ``adapt_every`` steps the layers' errors are measured, summed over the ranks, and
            bits per layer chosen to minimise the total error within that budget. Needs
            ``module``.
        module: the model, to key residuals and per-layer bits by parameter name (needed to
            checkpoint them).
        legacy: CGX's hook exactly (levers off unless given): compatibility mode for CGX's
            ``cgx_hook`` results (torch_cgx's own flag, not a CGX name).
        None for a lever: ``DEFAULT_LEVERS`` at the call's bit width.

    The group's settings are read and the native call options built once per version of them
    (``set_config`` makes a new version), never per gradient bucket.
    """

    __slots__ = ("compression_params", "levers", "legacy", "adaptive_bits", "adapt_every",
                 "layer_bits", "_energy")  # fmt: skip

    def __init__(
        self,
        process_group: Optional[dist.ProcessGroup] = None,
        min_size: Optional[int] = None,
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
        layer_min_size: Optional[int] = None,
    ) -> None:
        min_size = core.check_min_size(
            min_size, layer_min_size, "layer_min_size", min_size_default("hooks")
        )
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
        _check_adaptive(adaptive_bits, adapt_every, module, split_layers)
        self._init_layers(process_group, min_size, module)
        self.compression_params = params
        self.levers = {k: v for k, v in given.items() if v is not None}
        self.legacy = bool(legacy)
        self.adaptive_bits = None if adaptive_bits is None else float(adaptive_bits)
        self.adapt_every = adapt_every
        self.layer_bits: Dict[str, int] = {}
        self._energy: Dict[str, tuple] = {}

    def resolved(
        self, bits: int, stochastic: bool = False, bucket_size: Optional[int] = None
    ) -> Dict[str, bool]:
        """The levers of a call at ``bits``: the given ones, the rest from ``DEFAULT_LEVERS``
        (all off with ``legacy``), rotation and clip by the backend's rule for the call's
        ``bucket_size`` (None: the state's, else the group's default); rounding, unless given,
        is the group's (``stochastic``)."""
        if bucket_size is None:
            bucket_size = self.compression_params.get("bucket_size", _DEFAULT_BUCKET_SIZE)
        base = dict.fromkeys(_LEVERS, False) if self.legacy else dict(DEFAULT_LEVERS[bits])
        base["stochastic"] = stochastic
        base.update(self.levers)
        base["rotation"] = core.rotation_rule(base["rotation"], bits, bucket_size)
        base["clip"] = core.clip_rule(base.get("clip"), base["rotation"])
        if self.adaptive_bits is not None:
            base["split_layers"] = True
        return base

    def attach(self, module: torch.nn.Module, process_group=None) -> None:
        """The model whose parameter names key the residuals and bits (after ``__setstate__``),
        and the group (None: the default)."""
        super().attach(module, process_group)

    def __getstate__(self):
        self._check_keys()
        return {
            "min_size": self.min_size,
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
        self._restore_layers(state)  # reads the deprecated "layer_min_size" key too
        self.compression_params = state["compression_params"]
        # States saved before the levers existed are CGX's hook: keep what they did.
        self.levers = state.get("levers", {})
        self.legacy = state.get("legacy", "levers" not in state)
        self.adaptive_bits = state.get("adaptive_bits")
        self.adapt_every = state.get("adapt_every", 50)
        self.layer_bits = dict(state.get("layer_bits", {}))
        self._energy = {}


# torch.load(weights_only=True), torch's default, accepts the state (plain data and tensors).
torch.serialization.add_safe_globals([CGXState])


def _check_rotation_block(bucket_size: int) -> None:
    if not levers.valid_rotation_block(bucket_size):
        raise ValueError(
            f"rotation needs a bucket_size that is {ROTATION_BLOCKS_TEXT}, got {bucket_size}"
        )


def _check_adaptive(adaptive_bits, adapt_every, module, split_layers) -> None:
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


class _Plan:
    """What a state's calls read from the group's settings, resolved once per version of them:
    the base max-min settings (the hook's own rotation, never the group's too) and the levers."""

    __slots__ = ("base", "use")

    def __init__(self, state: CGXState, group: CGXConfig) -> None:
        self.base = group.replace(compressor="maxmin", compressor_params="", rotation="off",
                                  **state.compression_params)  # fmt: skip
        self.use = None
        if self.base.bits <= 8:
            # CGX_COMPRESSION_STOCHASTIC: the group's rounding unless the state gives its own
            self.use = state.resolved(self.base.bits, self.base.stochastic, self.base.bucket_size)
            if self.use["rotation"]:
                _check_rotation_block(self.base.bucket_size)

    def options(self, calls: core.NativeCalls, bits: int):
        """The native options of a compressed call at ``bits``."""
        use, base = self.use, self.base
        if bits == 1 and use["mean_levels"]:
            one = {"compressor": "onebit", "compressor_params": {"bucket_size": base.bucket_size}}
            return calls.options("onebit", lambda _: base.replace(**one))
        clip = "on" if use["clip"] else "off"
        return calls.options(
            ("maxmin", bits),
            lambda _: base.replace(bits=bits, stochastic=use["stochastic"], clip=clip),
        )


def _compress(state: CGXState, plan: _Plan, buf, comp, stream, whole, measure) -> List[core.Part]:
    """The compressed parts of ``comp`` (one per bit width)."""
    groups: Dict[int, List[tuple]] = {}
    for span in comp:
        groups.setdefault(state.layer_bits.get(state.key(span[2]), plan.base.bits), []).append(span)
    use, bucket_size = plan.use, plan.base.bucket_size
    rotation = use["rotation"]
    seed_of = {id(p): levers.rotation_seed(stream, j) for j, (_, _, p) in enumerate(comp)}
    # fp32 staging where residuals are added or values rotated.
    fp32 = use["error_feedback"] or rotation
    keep = state.keep if use["error_feedback"] else None
    parts = []
    for bits, spans in sorted(groups.items()):
        part = core.Part(
            plan.options(state._calls, bits), spans, stream=stream,
            residuals=[state.residual(p, n) for _, n, p in spans] if keep else None,
            seeds=[seed_of[id(p)] for _, _, p in spans] if rotation else [],
            bucket_size=bucket_size, split=use["split_layers"], fp32=fp32,
            whole=whole and len(groups) == 1, keep=keep,
        )  # fmt: skip
        if measure:
            _measure(state, part, buf, use["clip"])
        parts.append(part)
    return parts


def _measure(state: CGXState, part: core.Part, buf, clipped: bool) -> None:
    """Each layer's energy (adaptive bits), from the part staged as the backend stages it."""
    staged = core.stage_part(buf.clone() if part.whole else buf, part)  # leaves buf as it is
    energy_of = levers.spread_energy if clipped else levers.range_energy
    for (_, n, p), start, size in zip(part.spans, staged.starts, staged.sizes):
        energy = energy_of(staged.tensor, start, size, part.bucket_size)
        state._energy[state.key(p)] = (energy, n)


def _adapt(
    state: CGXState, keys: List[str], energies: torch.Tensor, sizes: List[int], clipped: bool
) -> None:
    """Every rank: bits per layer from the summed energies (identical on every rank)."""
    if not torch.isfinite(energies).all():
        return  # a non-finite step (AMP's skipped steps): keep the current choice
    bits = levers.choose_bits(energies.tolist(), sizes, state.adaptive_bits, clipped)
    state.layer_bits = dict(zip(keys, bits))


def cgx_hook(state: CGXState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Averages the gradient bucket: compressible layers with the state's bits, the rest
    exactly."""
    grad_bucket = bucket  # DDP's name for the argument; the quantizer's bucket is bucket_size
    calls_ = state._calls
    backend = calls_.refresh(state.process_group)
    plan = calls_.cached("cgx", lambda group: _Plan(state, group))
    buf = grad_bucket.buffer()
    comp, exact = state.spans(grad_bucket)
    if plan.use is None:  # bits 32: everything exact, its spans in the buffer's order
        comp, exact = [], sorted(comp + exact, key=lambda span: span[0])
    parts = []
    adapt_step = state.adaptive_bits is not None and state.steps % state.adapt_every == 0
    if comp:
        stream = core.call_stream(state, grad_bucket, comp[0][2])
        parts = _compress(state, plan, buf, comp, stream, not exact, adapt_step)
    if exact:
        parts.append(core.Part(calls_.exact(), exact, whole=not comp))
    extra, adapt = [], None
    # The last gradient bucket sums what every bucket measured, compressed layers of its own
    # or not.
    if adapt_step and grad_bucket.is_last() and state._energy:
        keys = sorted(state._energy)
        energies = torch.tensor([state._energy[k][0] for k in keys], dtype=torch.float64)
        adapt = (
            keys,
            energies,
            [state._energy[k][1] for k in keys],
            bool(plan.use and plan.use["clip"]),
        )
        state._energy = {}
        extra.append(lambda: _exact_sum(backend, calls_, energies))
    if grad_bucket.is_last():
        state.steps += 1
    after = None if adapt is None else (lambda: _adapt(state, *adapt))
    return core.reduce_bucket(backend, buf, parts, extra, after)


def _exact_sum(backend, calls: core.NativeCalls, tensor: torch.Tensor) -> torch.futures.Future:
    """Sums ``tensor`` (fp64) in place over the group, exactly."""
    return core.issue(backend, tensor, calls.exact(), average=False).get_future()
