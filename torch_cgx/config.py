"""Settings of the cgx backend: the ``CGX_*`` environment variables and a typed override.

=============================================  =========  =========================================
variable                                       default    meaning
=============================================  =========  =========================================
``CGX_COMPRESSION_QUANTIZATION_BITS``          32         bits per value, 1..8; 32 = no compression
``CGX_COMPRESSION_BUCKET_SIZE``                512        values per bucket (one min/step pair each)
``CGX_COMPRESSION_SKIP_INCOMPLETE_BUCKETS``    0          send the incomplete last bucket raw
``CGX_COMPRESSION_MINIMAL_SIZE``               16         smaller tensors are reduced exactly
                                                          (values below 16 count as 16, as in CGX)
``CGX_FUSION_BUFFER_SIZE_MB``                  64         largest piece reduced at once (MiB)
``CGX_REDUCTION_ALGORITHM``                    sra        ``sra`` (scatter-reduce-allgather),
                                                          ``ring``, ``tree`` (binomial; small
                                                          messages) or ``allgather``; when unset,
                                                          CGX's ``CGX_INNER_REDUCTION_TYPE``
                                                          (SRA|Ring|Tree)
``CGX_PIPELINE_SEGMENT_MB``                    4          every algorithm pipelines segments of
                                                          this size (encode one while another
                                                          is sent); 0 = no pipeline
``CGX_COMPRESSION_STOCHASTIC``                 0          stochastic rounding (unbiased)
``CGX_COMPRESSION_ROTATION``                   off        seeded rotation of each bucket before
                                                          max-min (docs/accuracy.md); auto: at
                                                          1-4 bits when the bucket size is a
                                                          power of two; on / off (1 / 0)
``CGX_COMPRESSION_CLIP``                       auto       narrow each max-min bucket's range to the
                                                          Gaussian-optimal one (mean +- c(bits)
                                                          standard deviations) where narrower;
                                                          auto: where the call rotates; on / off
``CGX_COMPRESSION_SEED``                       0          seed of the stochastic rounding
``CGX_COMPRESSOR``                             maxmin     a registered compressor
                                                          (``torch_cgx.compressors.names()``),
                                                          or ``auto``: the planner decides per
                                                          size (torch_cgx/plan/auto.py)
``CGX_COMPRESSOR_PARAMS``                      (none)     its parameters, ``name=value,...``
                                                          (max-min: the variables above)
``CGX_CODEC_THREADS``                          see right  codec threads per process, 1..1024;
                                                          default: usable cores divided by the
                                                          ranks on this host (LOCAL_WORLD_SIZE)
``CGX_DISABLE_AVX2``                           0          1: use the portable codec kernels
``CGX_SETTINGS_PER_CALL``                      1          read the first three variables again at
                                                          every allreduce, as CGX does (0: once)
``CGX_HIERARCHICAL``                           auto       node-aware allreduce: exact inside a
                                                          node, compressed across nodes; auto: on
                                                          when nodes hold several ranks; on / off
``CGX_INTRA_BROADCAST``                        1          1: only node leaders talk across nodes
                                                          (CGX's default); 0: every local rank
                                                          owns a slice of the buffer across nodes
``CGX_INNER_COMMUNICATOR_TYPE``                SHM        hierarchical intra-node transport: SHM
                                                          (shared memory), or MPI / NCCL / GLOO
                                                          (the node's Gloo group)
``CGX_INTRA_COMPRESS``                         off        hierarchical over SHM: values travel
                                                          to their node sum's owner as fp32
                                                          (off), fp16 or bf16 (1 / on: fp16)
``CGX_CROSS_COMMUNICATOR_TYPE``                (none)     CGX's cross-node transport: MPI, NCCL
                                                          or SHM (accepted; torch_cgx uses Gloo)
=============================================  =========  =========================================

As in CGX, ``CGX_COMPRESSION_QUANTIZATION_BITS``, ``CGX_COMPRESSION_BUCKET_SIZE`` and
``CGX_COMPRESSION_SKIP_INCOMPLETE_BUCKETS`` are read again at every allreduce: a script may change
them with ``os.environ[...] = ...`` between calls. A variable that changed since the group last
read it (set, changed, or unset: its default) replaces the group's value; values given to
:func:`torch_cgx.set_config` stay until a variable changes again (the last change wins). Every
allreduce that could be compressed then starts with a 16-byte allgather in which the ranks
agree on the three values; ranks that differ all raise ``ValueError`` naming the variable and
every rank's value. ``CGX_SETTINGS_PER_CALL=0`` (or ``set_config(settings_per_call=False)``)
reads them once and skips that exchange. Integers are decimal; booleans 1/0, true/false,
yes/no, on/off (one parser, in C++, for Python and for the per-call reads).

Compression is on when ``CGX_COMPRESSOR`` is max-min at 1..8 bits, or any other compressor.
``CGX_CODEC_THREADS`` and ``CGX_DISABLE_AVX2`` are per process and read once, at import; the
others are per group.

Every rank must use the same settings: the backend compares them through the store when a group
is created and whenever :func:`torch_cgx.set_config` changes them, and raises ``ValueError``
naming the differing ranks instead of exchanging garbage.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Mapping, Optional, Tuple

from torch_cgx import _C

ALGORITHMS = {"sra": 0, "ring": 1, "allgather": 2, "tree": 3}

_ENV = {
    "bits": "CGX_COMPRESSION_QUANTIZATION_BITS",
    "bucket_size": "CGX_COMPRESSION_BUCKET_SIZE",
    "skip_incomplete_buckets": "CGX_COMPRESSION_SKIP_INCOMPLETE_BUCKETS",
    "minimal_size": "CGX_COMPRESSION_MINIMAL_SIZE",
    "fusion_buffer_mb": "CGX_FUSION_BUFFER_SIZE_MB",
    "algorithm": "CGX_REDUCTION_ALGORITHM",
    "pipeline_segment_mb": "CGX_PIPELINE_SEGMENT_MB",
    "stochastic": "CGX_COMPRESSION_STOCHASTIC",
    "rotation": "CGX_COMPRESSION_ROTATION",
    "clip": "CGX_COMPRESSION_CLIP",
    "seed": "CGX_COMPRESSION_SEED",
    "compressor": "CGX_COMPRESSOR",
    "compressor_params": "CGX_COMPRESSOR_PARAMS",
    "settings_per_call": "CGX_SETTINGS_PER_CALL",
    "hierarchical": "CGX_HIERARCHICAL",
    "intra_broadcast": "CGX_INTRA_BROADCAST",
    "inner_communicator": "CGX_INNER_COMMUNICATOR_TYPE",
    "cross_communicator": "CGX_CROSS_COMMUNICATOR_TYPE",
    "intra_compress": "CGX_INTRA_COMPRESS",
}
# Fixed when a group is created (its node layout and Gloo subgroups): not for set_config.
CREATION_ONLY = ("hierarchical", "intra_broadcast", "inner_communicator", "cross_communicator",
                 "intra_compress")  # fmt: skip
_HIERARCHICAL = {"auto": "auto", "on": "on", "off": "off", "1": "on", "0": "off"}
_AUTO_ON_OFF = {"auto": "auto", "on": "on", "off": "off", "1": "on", "0": "off", "true": "on",
                "false": "off"}  # fmt: skip


def _power_of_two_block(bucket) -> bool:
    return _is_int(bucket) and 2 <= bucket <= 1 << 20 and bucket & (bucket - 1) == 0


# How a node's values travel to the owner of their node sum over shared memory: exact fp32, or
# rounded to a 16-bit float (half the memory traffic; 1 / on mean fp16).
_INTRA_COMPRESS = {"off": "off", "0": "off", "none": "off", "fp16": "fp16", "1": "fp16",
                   "on": "fp16", "bf16": "bf16"}  # fmt: skip
_COMMUNICATORS = {"inner_communicator": ("", "shm", "mpi", "nccl", "gloo"),
                  "cross_communicator": ("", "mpi", "nccl", "shm", "gloo")}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class CGXConfig:
    """Compression settings of one cgx process group (see the module docstring)."""

    bits: int = 32
    bucket_size: int = 512
    skip_incomplete_buckets: bool = False
    minimal_size: int = 16
    fusion_buffer_mb: int = 64
    algorithm: str = "sra"
    pipeline_segment_mb: int = 4
    stochastic: bool = False
    rotation: str = "off"
    clip: str = "auto"
    seed: int = 0
    compressor: str = "maxmin"
    compressor_params: str = ""  # canonical "name=value,..." (set_config also takes a dict)
    settings_per_call: bool = True
    hierarchical: str = "auto"
    intra_broadcast: bool = True
    inner_communicator: str = ""
    cross_communicator: str = ""
    intra_compress: str = "off"

    def __post_init__(self) -> None:
        if isinstance(self.compressor_params, Mapping):
            object.__setattr__(self, "compressor_params", _format_params(self.compressor_params))
        self.validate()

    def validate(self, names: Optional[Mapping[str, str]] = None) -> None:
        name = (names or {}).get

        def bad(field: str, why: str, value) -> ValueError:
            return ValueError(f"{name(field) or field} {why}, got {value!r}")

        if not _is_int(self.bits) or not (1 <= self.bits <= 8 or self.bits == 32):
            raise bad("bits", "must be 1..8, or 32 for no compression", self.bits)
        if not _is_int(self.bucket_size) or not 1 <= self.bucket_size < 2**32:
            raise bad("bucket_size", "must be an integer in [1, 2^32)", self.bucket_size)
        if not _is_int(self.minimal_size) or self.minimal_size < 0:
            raise bad("minimal_size", "must be an integer >= 0", self.minimal_size)
        if not _is_int(self.fusion_buffer_mb) or not 1 <= self.fusion_buffer_mb <= 1 << 20:
            raise bad(
                "fusion_buffer_mb", "must be an integer number of MiB >= 1", self.fusion_buffer_mb
            )
        if not _is_int(self.pipeline_segment_mb) or not 0 <= self.pipeline_segment_mb <= 1 << 20:
            raise bad("pipeline_segment_mb", "must be an integer number of MiB >= 0",
                      self.pipeline_segment_mb)  # fmt: skip
        if self.algorithm not in ALGORITHMS:
            raise bad("algorithm", f"must be one of {sorted(ALGORITHMS)}", self.algorithm)
        if not _is_int(self.seed) or not 0 <= self.seed < 2**64:
            raise bad("seed", "must be an integer in [0, 2^64)", self.seed)
        if self.hierarchical not in _HIERARCHICAL:
            raise bad("hierarchical", "must be auto, on or off (1 / 0)", self.hierarchical)
        object.__setattr__(self, "hierarchical", _HIERARCHICAL[self.hierarchical])
        rotation = _AUTO_ON_OFF.get(str(self.rotation).lower())
        if rotation is None:
            raise bad("rotation", "must be auto, on or off (1 / 0)", self.rotation)
        object.__setattr__(self, "rotation", rotation)
        clip = _AUTO_ON_OFF.get(str(self.clip).lower())
        if clip is None:
            raise bad("clip", "must be auto, on or off (1 / 0)", self.clip)
        object.__setattr__(self, "clip", clip)
        if rotation == "on" and not _power_of_two_block(self.bucket_size):
            raise bad("rotation", "on needs a bucket_size that is a power of two in [2, 2^20] "
                      f"(bucket_size {self.bucket_size})", self.rotation)  # fmt: skip
        mode = _INTRA_COMPRESS.get(str(self.intra_compress).lower())
        if mode is None:
            raise bad("intra_compress", "must be off, fp16 or bf16 (1 / on: fp16)",
                      self.intra_compress)  # fmt: skip
        object.__setattr__(self, "intra_compress", mode)
        for field, allowed in _COMMUNICATORS.items():
            if getattr(self, field) not in allowed:
                raise bad(field, f"must be one of {[a.upper() for a in allowed if a]}",
                          getattr(self, field))  # fmt: skip
        if self.intra_compress != "off" and self.inner_communicator not in ("", "shm"):
            raise bad("intra_compress", "needs the shared-memory intra-node transport "
                      f"(CGX_INNER_COMMUNICATOR_TYPE=SHM), not {self.inner_communicator.upper()}",
                      self.intra_compress)  # fmt: skip
        for flag in ("skip_incomplete_buckets", "stochastic", "settings_per_call",
                     "intra_broadcast"):  # fmt: skip
            if not isinstance(getattr(self, flag), bool):
                raise bad(flag, "must be a bool", getattr(self, flag))
        known = list(_C.compressor_names()) + ["auto"]
        if self.compressor not in known:
            raise bad("compressor", f"must be one of {known}", self.compressor)
        params = _parse_params(name("compressor_params") or "compressor_params",
                               self.compressor_params)  # fmt: skip
        object.__setattr__(self, "compressor_params", _format_params(params))  # canonical text
        if self.compressor in ("maxmin", "auto") and params:
            raise bad("compressor_params", f"must be empty for {self.compressor} (it takes bits, "
                      "bucket_size, ...)", self.compressor_params)  # fmt: skip
        if self.compressor == "auto":
            return
        try:
            _C.make_compressor(self.compressor, params)
        except ValueError as e:
            raise ValueError(f"{name('compressor_params') or 'compressor_params'}: {e}") from None

    @property
    def compressed(self) -> bool:
        return self.bits <= 8 or self.compressor != "maxmin"

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None) -> CGXConfig:
        """Reads the ``CGX_*`` variables; a malformed value raises ValueError naming it."""
        env = os.environ if env is None else env
        values, names = {}, dict(_ENV)
        for field in dataclasses.fields(cls):
            var = _ENV[field.name]
            raw = env.get(var)
            if raw is None and field.name == "algorithm":
                var = names["algorithm"] = "CGX_INNER_REDUCTION_TYPE"  # CGX's name
                raw = env.get(var)
            if raw is None or raw.strip() == "":
                continue
            values[field.name] = _parse(var, field.type, raw.strip())
        config = cls.__new__(cls)
        for field in dataclasses.fields(cls):
            object.__setattr__(config, field.name, values.get(field.name, field.default))
        config.validate(names=names)
        return config

    def replace(self, **changes) -> CGXConfig:
        unknown = set(changes) - {f.name for f in dataclasses.fields(self)}
        if unknown:
            raise ValueError(f"unknown cgx setting(s): {sorted(unknown)}")
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_native(cls, native: _C.BackendConfig) -> CGXConfig:
        names = {v: k for k, v in ALGORITHMS.items()}
        return cls(
            bits=native.bits,
            bucket_size=native.bucket_size,
            skip_incomplete_buckets=native.skip_incomplete_buckets,
            minimal_size=native.minimal_size,
            fusion_buffer_mb=native.fusion_buffer_bytes >> 20,
            algorithm=names[native.algorithm],
            pipeline_segment_mb=native.pipeline_segment_bytes >> 20,
            stochastic=native.stochastic,
            rotation=native.rotation,
            clip=native.clip,
            seed=native.seed,
            compressor=native.compressor,
            compressor_params=_format_params(native.compressor_params),
            settings_per_call=native.settings_per_call,
            hierarchical=native.hierarchical,
            intra_broadcast=native.intra_broadcast,
            inner_communicator=native.inner_communicator,
            cross_communicator=native.cross_communicator,
            intra_compress=native.intra_compress,
        )

    def to_native(self) -> _C.BackendConfig:
        native = _C.BackendConfig()
        native.bits = self.bits
        native.bucket_size = self.bucket_size
        native.skip_incomplete_buckets = self.skip_incomplete_buckets
        native.minimal_size = self.minimal_size
        native.fusion_buffer_bytes = self.fusion_buffer_mb << 20
        native.algorithm = ALGORITHMS[self.algorithm]
        native.pipeline_segment_bytes = self.pipeline_segment_mb << 20
        native.stochastic = self.stochastic
        native.rotation = self.rotation
        native.clip = self.clip
        native.seed = self.seed
        native.compressor = self.compressor
        native.compressor_params = _parse_params("compressor_params", self.compressor_params)
        native.settings_per_call = self.settings_per_call
        for field in CREATION_ONLY:
            setattr(native, field, getattr(self, field))
        return native

    def describe(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


def process_settings_from_env(env: Optional[Mapping[str, str]] = None) -> Tuple[int, bool]:
    """(codec threads, AVX2 allowed) from ``CGX_CODEC_THREADS`` / ``CGX_DISABLE_AVX2``.

    The default thread count shares the host's cores among its ranks: the cores this process
    may run on, divided by ``LOCAL_WORLD_SIZE`` (torchrun; mapped from mpirun's variables by
    torch_cgx.launch), at least 1. A malformed value raises ValueError naming the variable.
    """
    env = os.environ if env is None else env
    raw = env.get("CGX_CODEC_THREADS", "").strip()
    if raw:
        threads = _parse("CGX_CODEC_THREADS", "int", raw)
        if not 1 <= threads <= 1024:
            raise ValueError(f"CGX_CODEC_THREADS must be in [1, 1024], got {raw!r}")
    else:
        local = env.get("LOCAL_WORLD_SIZE", "").strip()
        ranks = _parse("LOCAL_WORLD_SIZE", "int", local) if local else 1
        if ranks < 1:
            raise ValueError(f"LOCAL_WORLD_SIZE must be >= 1, got {local!r}")
        threads = min(1024, max(1, _usable_cores() // ranks))
    raw = env.get("CGX_DISABLE_AVX2", "").strip()
    disable = _parse("CGX_DISABLE_AVX2", "bool", raw) if raw else False
    return threads, not disable


def _usable_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _parse_params(var: str, text: str) -> dict:
    """``"ratio=0.001,sample_rate=0.01"`` -> ``{"ratio": 0.001, "sample_rate": 0.01}``."""
    out = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, sep, value = item.partition("=")
        try:
            if not sep or not key.strip():
                raise ValueError
            out[key.strip()] = float(value)
        except ValueError:
            raise ValueError(f"{var} must be name=number pairs separated by commas, got "
                             f"{text!r}") from None  # fmt: skip
    return out


def _format_params(params: Mapping) -> str:
    """The canonical text of a parameter mapping: sorted, numbers as Python writes them."""
    parts = []
    for key in sorted(params):
        value = params[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"compressor parameter {key} must be a number, got {value!r}")
        value = float(value)
        parts.append(f"{key}={int(value) if value.is_integer() else value!r}")
    return ",".join(parts)


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _parse(var: str, kind: str, raw: str):
    if kind == "bool":
        return _C.parse_env_bool(var, raw)
    if kind == "int":
        return _C.parse_env_int(var, raw)
    return raw.lower()
