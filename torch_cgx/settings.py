"""Every setting of torch_cgx, declared once.

Each :class:`Setting` names the keyword a script passes (``torch_cgx.Options(bits=4)``,
``set_config(group, bits=4)``), the ``CGX_*`` environment variable, the type, the default, the
range (its ``check``), the scope and one line of documentation. From this table come:

- the typed group settings :class:`torch_cgx.config.CGXConfig` (one field per group setting),
  their validation and the copy to and from the native ``_C.BackendConfig`` (torch_cgx/config.py);
- the environment readers: :func:`read_env` is the only Python code that reads ``CGX_*``
  variables (the per-call re-read of the ``call`` settings is C++'s, csrc/torch/call_settings.cc);
- the settings reference, docs/settings.md (``make settings-doc`` writes it from
  :func:`torch_cgx.settings_doc.markdown`; a test fails when the file and the table differ);
- csrc/torch/settings_rules.h, the native defaults, ranges and messages (scripts/settings_rules.py
  writes it, ``make settings-doc``); BackendConfig and the native validation read it;
- the device plane's checks, through :func:`quantizes`, :func:`rotation_block` and the constants;
- a test that the native defaults equal the table's.

Scopes:

- ``process``: read once, at ``import torch_cgx``; one value per process.
- ``creation``: fixed when a group is created (its node layout and Gloo subgroups).
- ``group``: per group, changed by the collective ``set_config``.
- ``call``: per group like ``group``, and, as in CGX, read again from the environment at every
  allreduce while ``settings_per_call`` is on.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

SCOPES = ("process", "creation", "group", "call")
ALGORITHMS = {"sra": 0, "ring": 1, "allgather": 2, "tree": 3}

_AUTO_ON_OFF = {"auto": "auto", "on": "on", "off": "off", "1": "on", "0": "off", "true": "on",
                "false": "off"}  # fmt: skip
_INTRA_COMPRESS = {"off": "off", "0": "off", "none": "off", "fp16": "fp16", "1": "fp16",
                   "on": "fp16", "bf16": "bf16"}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class Setting:
    """One setting: see the module docstring."""

    name: str
    env: str
    type: type
    default: Any
    scope: str
    doc: str
    # Normalises a value (e.g. "ON" -> "on") or raises ValueError with the reason (the caller
    # prefixes the setting's name or variable).
    check: Callable[[Any], Any]
    # The field of _C.BackendConfig, and the conversions to and from it (None: Python only).
    native: Optional[str] = None
    to_native: Callable[[Any], Any] = staticmethod(lambda v: v)
    from_native: Callable[[Any], Any] = staticmethod(lambda v: v)
    env_alias: Optional[str] = None  # compatibility alias: CGX's variable, read when `env` unset
    aliases: Tuple[str, ...] = ()  # deprecated keyword names still accepted (docs/guide.md)
    default_doc: Optional[str] = None  # the default as the docs print it, when computed


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


@dataclasses.dataclass(frozen=True)
class IntRange:
    """An integer setting's rule: [lo, hi], plus the values of ``also`` (bits' 32: no
    compression); ``text`` is how every layer's message states it. Called, it checks a value.
    The native validation (csrc/torch/settings_rules.h, generated) carries the same numbers."""

    lo: int
    hi: int
    also: Tuple[int, ...] = ()
    text: str = ""

    def __post_init__(self) -> None:
        if not self.text:
            object.__setattr__(self, "text", f"must be an integer in [{self.lo}, {self.hi}]")

    def ok(self, v) -> bool:
        return _is_int(v) and (self.lo <= v <= self.hi or v in self.also)

    def __call__(self, v):
        if not self.ok(v):
            raise ValueError(self.text)
        return v


# rotation "on" needs a bucket_size that is a power of two in this range: the rotation's blocks
# (torch_cgx/device/rotation.py reads them; csrc/core/rotation.h's, a static_assert checks).
ROTATION_BLOCKS, ROTATION_BLOCKS_TEXT = (2, 1 << 20), "a power of two in [2, 2^20]"
# Tensors under min_size values are reduced exactly; a min_size below this acts as it.
MIN_SIZE_FLOOR = 16


def quantizes(bits: int) -> bool:
    """Whether max-min at ``bits`` compresses (the bits range, 1..8; its other value, 32, not)."""
    return BY_NAME["bits"].check.lo <= bits <= BY_NAME["bits"].check.hi


def native_default(name: str):
    """The default of setting ``name`` in native units (e.g. bytes for the MiB settings)."""
    return BY_NAME[name].to_native(BY_NAME[name].default)


def rotation_block(bucket_size: int) -> bool:
    """Whether max-min buckets of ``bucket_size`` values can rotate (ROTATION_BLOCKS)."""
    lo, hi = ROTATION_BLOCKS
    return _is_int(bucket_size) and lo <= bucket_size <= hi and bucket_size & (bucket_size - 1) == 0


def _flag(v):
    if not isinstance(v, bool):
        raise ValueError("must be a bool")
    return v


def _one_of(table: Mapping[str, str], what: str) -> Callable[[Any], str]:
    def check(v):
        out = table.get(str(v).lower()) if isinstance(v, (str, int)) else None
        if out is None:
            raise ValueError(f"must be {what}")
        return out

    return check


def _algorithm(v):
    v = str(v).lower() if isinstance(v, str) else v
    if v not in ALGORITHMS:
        raise ValueError(f"must be one of {sorted(ALGORITHMS)}")
    return v


def _communicator(allowed: Tuple[str, ...]) -> Callable[[Any], str]:
    def check(v):
        v = str(v).lower() if isinstance(v, str) else v
        if v not in allowed:
            raise ValueError(f"must be one of {[a.upper() for a in allowed if a]}")
        return v

    return check


def _cross_communicator(v):
    v = str(v).lower() if isinstance(v, str) else v
    if v in ("", "gloo"):
        return v
    if v in ("mpi", "nccl", "shm"):
        raise ValueError(
            f"{v.upper()} would do nothing here: torch_cgx carries cross-node traffic over "
            "torch's Gloo; unset it (or set GLOO)"
        )
    raise ValueError("must be GLOO (or unset)")


_AUTO_ON_OFF_CHECK = _one_of(_AUTO_ON_OFF, "auto, on or off (1 / 0)")


def _text(v):
    if not isinstance(v, str):
        raise ValueError("must be a string")
    return v


def _mib(v):  # MiB in Python, bytes natively
    return v << 20


SETTINGS: Tuple[Setting, ...] = (
    Setting("bits", "CGX_COMPRESSION_QUANTIZATION_BITS", int, 32, "call",
            "max-min bits per value, 1..8; 32 = no compression", native="bits",
            check=IntRange(1, 8, also=(32,), text="must be 1..8, or 32 for no compression")),
    Setting("bucket_size", "CGX_COMPRESSION_BUCKET_SIZE", int, 512, "call",
            "values per max-min bucket (each sends its min and step, 8 bytes)",
            IntRange(1, 2**32 - 1, text="must be an integer in [1, 2^32)"),
            native="bucket_size"),
    Setting("skip_incomplete_buckets", "CGX_COMPRESSION_SKIP_INCOMPLETE_BUCKETS", bool, False,
            "call", "send the incomplete last bucket raw", _flag,
            native="skip_incomplete_buckets"),
    Setting("min_size", "CGX_COMPRESSION_MINIMAL_SIZE", int, 16, "group",
            f"tensors with fewer values are reduced exactly (values below {MIN_SIZE_FLOOR} act as "
            f"{MIN_SIZE_FLOOR}); the hooks and FSDP have their own defaults (below)",
            IntRange(0, 2**62), native="minimal_size", aliases=("minimal_size",)),
    Setting("fusion_buffer_mb", "CGX_FUSION_BUFFER_SIZE_MB", int, 64, "group",
            "tensors are reduced in pieces of at most this many MiB", IntRange(1, 1 << 20),
            native="fusion_buffer_bytes", to_native=_mib, from_native=lambda b: b >> 20),
    Setting("algorithm", "CGX_REDUCTION_ALGORITHM", str, "sra", "group",
            "`sra` (scatter-reduce-allgather), `ring`, `tree` (binomial, small messages) or "
            "`allgather` (each value compressed once; the sparse compressors' path); CGX's "
            "`CGX_INNER_REDUCTION_TYPE` (SRA, Ring, Tree) is read when unset", _algorithm,
            native="algorithm", to_native=ALGORITHMS.__getitem__,
            from_native={v: k for k, v in ALGORITHMS.items()}.__getitem__,
            env_alias="CGX_INNER_REDUCTION_TYPE"),
    Setting("pipeline_segment_mb", "CGX_PIPELINE_SEGMENT_MB", int, 4, "group",
            "segments of this many MiB are encoded while the previous one is on the wire "
            "(CaSync); 0 = no pipeline", IntRange(0, 1 << 20),
            native="pipeline_segment_bytes", to_native=_mib, from_native=lambda b: b >> 20),
    Setting("stochastic", "CGX_COMPRESSION_STOCHASTIC", bool, False, "group",
            "stochastic (unbiased) rounding", _flag, native="stochastic"),
    Setting("rotation", "CGX_COMPRESSION_ROTATION", str, "off", "group",
            "seeded rotation of every full max-min bucket before quantizing, undone after "
            "(docs/accuracy.md); auto: at 1-4 bits with a power-of-two bucket size; on / off",
            _AUTO_ON_OFF_CHECK, native="rotation"),
    Setting("clip", "CGX_COMPRESSION_CLIP", str, "auto", "group",
            "quantize each max-min bucket over the Gaussian-optimal range (mean +- c(bits) "
            "standard deviations) where narrower; auto: where the call rotates; on / off",
            _AUTO_ON_OFF_CHECK, native="clip"),
    Setting("seed", "CGX_COMPRESSION_SEED", int, 0, "group",
            "seed of the random streams (stochastic rounding, rotation, random-k)",
            IntRange(0, 2**64 - 1), native="seed"),
    Setting("compressor", "CGX_COMPRESSOR", str, "maxmin", "group",
            "a registered compressor (`torch_cgx.compressors.names()`), or `auto`: the "
            "planner chooses per size (docs/algorithms.md)", _text, native="compressor"),
    Setting("compressor_params", "CGX_COMPRESSOR_PARAMS", str, "", "group",
            "its parameters, `name=value,...` (e.g. `ratio=0.001`); max-min takes the "
            "settings above instead", _text, native="compressor_params"),
    Setting("settings_per_call", "CGX_SETTINGS_PER_CALL", bool, True, "group",
            "read the `call` settings' variables again at every allreduce, as CGX does "
            "(the ranks then agree on them, 16 bytes); 0: once, at group creation", _flag,
            native="settings_per_call"),
    Setting("hierarchical", "CGX_HIERARCHICAL", str, "auto", "creation",
            "node-aware allreduce (exact inside a node, compressed across nodes); auto: on "
            "when several nodes hold several ranks", _AUTO_ON_OFF_CHECK, native="hierarchical"),
    Setting("intra_broadcast", "CGX_INTRA_BROADCAST", bool, True, "creation",
            "1: only node leaders talk across nodes (CGX's default); 0: every local rank owns "
            "a slice of the buffer across nodes", _flag, native="intra_broadcast"),
    Setting("inner_communicator", "CGX_INNER_COMMUNICATOR_TYPE", str, "", "creation",
            "intra-node transport of the hierarchical allreduce: SHM (a shared-memory segment "
            "per node; unset: SHM) or MPI / NCCL / GLOO (the node's Gloo group)",
            _communicator(("", "shm", "mpi", "nccl", "gloo")), native="inner_communicator",
            default_doc="(SHM)"),
    Setting("cross_communicator", "CGX_CROSS_COMMUNICATOR_TYPE", str, "", "creation",
            "CGX's cross-node transport: torch's Gloo carries it, so only GLOO (or unset) is "
            "accepted; CGX's MPI / NCCL / SHM are refused with a message",
            _cross_communicator, native="cross_communicator", default_doc="(GLOO)"),
    Setting("intra_compress", "CGX_INTRA_COMPRESS", str, "off", "creation",
            "hierarchical over SHM: values travel to their node sum's owner as fp32 (off), "
            "fp16 or bf16 (1 / on: fp16)",
            _one_of(_INTRA_COMPRESS, "off, fp16 or bf16 (1 / on: fp16)"), native="intra_compress"),
    Setting("data_plane", "CGX_DATA_PLANE", str, "auto", "creation",
            "where tensors are compressed: auto (CUDA tensors on their GPU, carried by NCCL or, "
            "where NCCL cannot serve, Gloo; CPU tensors by the native engine), device (every "
            "tensor through the device plane's tensor operations: how the CPU tests run it) or "
            "host (CUDA tensors through a host copy and the native engine)",
            _one_of({"auto": "auto", "device": "device", "host": "host"},
                    "auto, device or host"), native="data_plane"),
    Setting("codec_threads", "CGX_CODEC_THREADS", int, 0, "process",
            "codec threads per process for large buffers, 1..1024; default: the cores this "
            "process may use divided by `LOCAL_WORLD_SIZE`", IntRange(1, 1024),
            default_doc="cores / local ranks"),
    Setting("disable_avx2", "CGX_DISABLE_AVX2", bool, False, "process",
            "1: the portable codec kernels instead of AVX2 (the same bytes)", _flag),
    Setting("device_kernels", "CGX_DEVICE_KERNELS", str, "auto", "process",
            "the device plane's fused kernels: auto (each checks itself against the reference "
            "at first use and falls back to it with a warning on a mismatch), fused (a "
            "mismatch raises) or reference (tensor operations only)",
            _one_of({"auto": "auto", "fused": "fused", "reference": "reference"},
                    "auto, fused or reference")),
)  # fmt: skip

BY_NAME: Dict[str, Setting] = {s.name: s for s in SETTINGS}
ALIASES: Dict[str, str] = {a: s.name for s in SETTINGS for a in s.aliases}
GROUP_SETTINGS = tuple(s for s in SETTINGS if s.scope != "process")
CREATION_ONLY = tuple(s.name for s in SETTINGS if s.scope == "creation")
CALL_SETTINGS = tuple(s.name for s in SETTINGS if s.scope == "call")

# min_size's default at each entry point, and why it differs (docs/settings.md prints this).
MIN_SIZE_DEFAULTS: Dict[str, Tuple[int, str]] = {
    "group": (BY_NAME["min_size"].default, "any allreduce or reduce-scatter of a whole tensor on "
              "a cgx group, host engine and device plane (`CGX_COMPRESSION_MINIMAL_SIZE`)"),
    "hooks": (1024, "`cgx_hook` and `compression_hook` (`CGXState`, `CompressionState`): per "
              "layer, CGX's `layer_min_size` default; layers with `dim() <= 1` stay exact too"),
    "policy_hook": (0, "`PolicyState`: the policy decides for every parameter, small ones "
                    "included"),
    "fsdp": (4096, "`fsdp.compress`, `CompressedReduceScatter`, `CompressedAllGather`: per "
             "chunk, 1/W of a parameter group's flat buffer, hence larger (not re-measured)"),
}  # fmt: skip


def min_size_default(entry: str) -> int:
    """The default min_size of ``entry``, a key of MIN_SIZE_DEFAULTS."""
    return MIN_SIZE_DEFAULTS[entry][0]


def canonical_name(name: str) -> str:
    """The setting's name for ``name`` or one of its aliases; ValueError for an unknown one."""
    name = ALIASES.get(name, name)
    if name not in BY_NAME:
        raise ValueError(f"unknown cgx setting {name!r}; the settings: {sorted(BY_NAME)}")
    return name


def parse_env_value(setting: Setting, var: str, raw: str):
    """The typed value of ``raw`` for ``setting`` read from variable ``var`` (the one parser of
    integers and booleans is C++'s, shared with the per-call reads)."""
    from torch_cgx import _C

    if setting.type is bool:
        return _C.parse_env_bool(var, raw)
    if setting.type is int:
        return _C.parse_env_int(var, raw)
    return raw.lower() if setting.name != "compressor_params" else raw


def read_env(scope_names: Tuple[str, ...], env: Optional[Mapping[str, str]] = None):
    """``({name: value}, {name: variable read})`` of the settings in ``scope_names`` that are set
    in ``env`` (default ``os.environ``), typed but not yet validated."""
    env = os.environ if env is None else env
    values, names = {}, {}
    for s in SETTINGS:
        if s.scope not in scope_names:
            continue
        var, raw = s.env, env.get(s.env)
        if (raw is None or raw.strip() == "") and s.env_alias:
            var, raw = s.env_alias, env.get(s.env_alias)
        if raw is None or raw.strip() == "":
            continue
        values[s.name] = parse_env_value(s, var, raw.strip())
        names[s.name] = var
    return values, names


def launcher_env(env: Optional[Mapping[str, str]] = None) -> Dict[str, Optional[str]]:
    """The launcher's variables torch_cgx reads (torchrun's; mpirun's are mapped to them at
    import by torch_cgx.launch): ``LOCAL_WORLD_SIZE`` and ``RANK``."""
    env = os.environ if env is None else env
    return {k: env.get(k) for k in ("LOCAL_WORLD_SIZE", "RANK")}


def usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


@dataclasses.dataclass(frozen=True)
class ProcessSettings:
    codec_threads: int
    avx2: bool


def process_settings(env: Optional[Mapping[str, str]] = None) -> ProcessSettings:
    """The ``process`` settings from ``env``: the codec's thread count (default: the usable cores
    shared among this host's ranks) and whether AVX2 kernels may run. ValueError names a bad
    variable."""
    values, names = read_env(("process",), env)
    for name, value in values.items():
        try:
            values[name] = BY_NAME[name].check(value)
        except ValueError as e:
            raise ValueError(f"{names[name]} {e}, got {value!r}") from None
    threads = values.get("codec_threads")
    if threads is None:
        local = (launcher_env(env)["LOCAL_WORLD_SIZE"] or "").strip()
        from torch_cgx import _C

        ranks = _C.parse_env_int("LOCAL_WORLD_SIZE", local) if local else 1
        if ranks < 1:
            raise ValueError(f"LOCAL_WORLD_SIZE must be >= 1, got {local!r}")
        threads = min(1024, max(1, usable_cores() // ranks))
    return ProcessSettings(threads, not values.get("disable_avx2", False))
