"""The typed settings of one cgx process group, built from the table in torch_cgx/settings.py.

:class:`CGXConfig` has one field per group setting (scopes ``creation``, ``group`` and ``call``
of the table; the reference is docs/settings.md, generated from the same table). It validates
every field with the table's checks, names the field (or the ``CGX_*`` variable it came from)
in every error, and copies itself to and from the native ``_C.BackendConfig`` field by field as
the table says.

As in CGX, the ``call`` settings (``CGX_COMPRESSION_QUANTIZATION_BITS``,
``CGX_COMPRESSION_BUCKET_SIZE``, ``CGX_COMPRESSION_SKIP_INCOMPLETE_BUCKETS``) are read again at
every allreduce while ``settings_per_call`` is on: a variable that changed since the group last
read it (set, changed, or unset: its default) replaces the group's value; values given to
:func:`torch_cgx.set_config` stay until a variable changes again (the last change wins). Every
allreduce that could be compressed then starts with a 16-byte allgather in which the ranks agree
on the three values; ranks that differ all raise ``ValueError`` naming the variable and every
rank's value.

Compression is on when the compressor is max-min at 1..8 bits, or any other compressor. Every
rank must use the same settings: the backend compares them through the store when a group is
created and whenever :func:`torch_cgx.set_config` changes them, and raises ``ValueError`` naming
the differing ranks instead of exchanging garbage.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Mapping, Optional

from torch_cgx import _C
from torch_cgx import settings as _settings
from torch_cgx.settings import ALGORITHMS, CREATION_ONLY  # noqa: F401  (re-exported)

__all__ = ["CGXConfig", "ALGORITHMS", "CREATION_ONLY", "Options"]


class _ConfigMethods:
    """The behaviour of :class:`CGXConfig`; its fields come from the settings table."""

    __slots__ = ()

    def __post_init__(self) -> None:
        if isinstance(self.compressor_params, Mapping):
            object.__setattr__(self, "compressor_params", _format_params(self.compressor_params))
        self.validate()

    def validate(self, names: Optional[Mapping[str, str]] = None) -> None:
        """Checks and normalises every field; ``names`` maps a field to the variable it was
        read from, for the message."""
        name = (names or {}).get
        for s in _settings.GROUP_SETTINGS:
            value = getattr(self, s.name)
            try:
                object.__setattr__(self, s.name, s.check(value))
            except ValueError as e:
                raise ValueError(f"{name(s.name) or s.name} {e}, got {value!r}") from None
        self._check_together(name)

    def _check_together(self, name) -> None:
        def bad(field: str, why: str, value) -> ValueError:
            return ValueError(f"{name(field) or field} {why}, got {value!r}")

        if self.rotation == "on" and not _settings.rotation_block(self.bucket_size):
            raise bad("rotation", f"on needs a bucket_size that is {_settings.ROTATION_BLOCKS_TEXT}"
                      f" (bucket_size {self.bucket_size})", self.rotation)  # fmt: skip
        if self.intra_compress != "off" and self.inner_communicator not in ("", "shm"):
            raise bad("intra_compress", "needs the shared-memory intra-node transport "
                      f"(CGX_INNER_COMMUNICATOR_TYPE=SHM), not {self.inner_communicator.upper()}",
                      self.intra_compress)  # fmt: skip
        from torch_cgx import compressors

        known = compressors.names() + ["auto"]
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
            compressors.get(self.compressor, **params)
        except ValueError as e:
            raise ValueError(f"{name('compressor_params') or 'compressor_params'}: {e}") from None

    def check_effective(self, names: Optional[Mapping[str, str]] = None) -> None:
        """Refuses a setting a user asked for that would do nothing (the entry points call it:
        the environment, Options, set_config; derived settings inside the hooks may differ)."""
        name = (names or {}).get
        for lever in ("rotation", "clip"):
            if getattr(self, lever) == "on" and self.compressor not in ("maxmin", "auto"):
                raise ValueError(
                    f"{name(lever) or lever}=on would do nothing: it applies to "
                    f"max-min only, and the compressor is {self.compressor}"
                )

    @property
    def compressed(self) -> bool:
        return _settings.quantizes(self.bits) or self.compressor != "maxmin"

    @property
    def minimal_size(self) -> int:
        """Deprecated alias of :attr:`min_size`: use ``min_size``. No compatibility target reads
        it: CGX's name is the environment variable ``CGX_COMPRESSION_MINIMAL_SIZE``, which stays
        the setting's own variable."""
        return self.min_size

    @classmethod
    def from_env(cls, env: Optional[Mapping[str, str]] = None, **given) -> CGXConfig:
        """The ``CGX_*`` variables of ``env`` (default: the process environment), with the
        keywords ``given`` (e.g. from :class:`Options`) taking precedence; a malformed value
        raises ValueError naming its variable or keyword."""
        values, names = _settings.read_env(("creation", "group", "call"), env)
        for key, value in given.items():
            key = _settings.canonical_name(key)
            values[key] = value
            names.pop(key, None)
        config = cls.__new__(cls)
        for s in _settings.GROUP_SETTINGS:
            object.__setattr__(config, s.name, values.get(s.name, s.default))
        config.validate(names=names)
        config.check_effective(names)
        return config

    def replace(self, **changes) -> CGXConfig:
        try:
            changes = {_settings.canonical_name(k): v for k, v in changes.items()}
        except ValueError:
            unknown = sorted(set(changes) - set(_settings.BY_NAME) - set(_settings.ALIASES))
            raise ValueError(f"unknown cgx setting(s): {unknown}") from None
        process = sorted(k for k in changes if _settings.BY_NAME[k].scope == "process")
        if process:
            raise ValueError(f"{process} are per process (CGX_* variables read at import), not "
                             "per group")  # fmt: skip
        return dataclasses.replace(self, **changes)

    @classmethod
    def from_native(cls, native: _C.BackendConfig) -> CGXConfig:
        values = {}
        for s in _settings.GROUP_SETTINGS:
            value = s.from_native(getattr(native, s.native))
            values[s.name] = _format_params(value) if s.name == "compressor_params" else value
        return cls(**values)

    def to_native(self) -> _C.BackendConfig:
        native = _C.BackendConfig()
        for s in _settings.GROUP_SETTINGS:
            value = s.to_native(getattr(self, s.name))
            if s.name == "compressor_params":
                value = _parse_params("compressor_params", value)
            setattr(native, s.native, value)
        return native

    def describe(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)


CGXConfig = dataclasses.make_dataclass(
    "CGXConfig",
    [(s.name, s.type, dataclasses.field(default=s.default)) for s in _settings.GROUP_SETTINGS],
    bases=(_ConfigMethods,),
    frozen=True,
)
CGXConfig.__module__ = __name__
CGXConfig.__doc__ = (
    "Settings of one cgx process group: one field per group setting of torch_cgx/settings.py "
    "(docs/settings.md). Immutable; ``replace(**changes)`` returns a validated copy."
)


class Options:
    """Typed settings for a new cgx group, passed as ``pg_options``::

        dist.init_process_group("cgx", pg_options=torch_cgx.Options(bits=4, algorithm="ring"))
        dist.new_group(ranks, backend="cgx", pg_options=torch_cgx.Options(bits=8))

    Each keyword is a setting of docs/settings.md (not the ``process`` ones); it wins over its
    ``CGX_*`` variable, and settings not given come from the environment, then the defaults.
    Every keyword is checked here (ValueError naming it); the whole set again when the group is
    created, with the environment's values.
    """

    def __init__(self, **settings) -> None:
        given = {}
        for key, value in settings.items():
            try:
                name = _settings.canonical_name(key)
            except ValueError:
                known = sorted(s.name for s in _settings.GROUP_SETTINGS)
                raise ValueError(f"Options: unknown cgx setting {key!r}; known: {known}") from None
            if _settings.BY_NAME[name].scope == "process":
                var = _settings.BY_NAME[name].env
                raise ValueError(f"Options: {name} is per process ({var}, read at import)")
            given[name] = value
        CGXConfig(**given)  # each value checked now, against the defaults
        self.settings = given

    def config(self, env: Optional[Mapping[str, str]] = None) -> CGXConfig:
        """The group's settings: these keywords over the environment's variables."""
        return CGXConfig.from_env(env, **self.settings)

    def __repr__(self) -> str:
        inner = ", ".join(f"{k}={v!r}" for k, v in self.settings.items())
        return f"torch_cgx.Options({inner})"

    def __eq__(self, other) -> bool:
        return isinstance(other, Options) and other.settings == self.settings


def _parse_params(var: str, text) -> dict:
    """``"ratio=0.001,sample_rate=0.01"`` -> ``{"ratio": 0.001, "sample_rate": 0.01}``."""
    if isinstance(text, Mapping):
        return {k: float(v) for k, v in text.items()}
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


def _format_params(params) -> str:
    """The canonical text of a parameter mapping: sorted, numbers as Python writes them."""
    if isinstance(params, str):
        return params
    parts = []
    for key in sorted(params):
        value = params[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"compressor parameter {key} must be a number, got {value!r}")
        value = float(value)
        parts.append(f"{key}={int(value) if value.is_integer() else value!r}")
    return ",".join(parts)
