"""Reference max-min codec written from docs/FORMAT.md alone, in numpy.

It is the oracle of tests/test_codec.py and deliberately shares no code with the C++ codec:
fp32 element arithmetic is done on ``np.float32`` arrays (one IEEE rounding per operation, no
FMA), per-bucket scalars in fp64 then rounded to fp32, and the stochastic-rounding generator is
transcribed twice: once literally on Python ints masked to 64/32 bits (``uniform``), once
vectorized on numpy uint32 arrays (``uniform_array``).

Inputs are given as raw numpy arrays plus a dtype name: ``float32`` arrays, or the ``uint16``
bit patterns of ``float16`` / ``bfloat16`` values (so that the raw tail is copied bit for bit).
"""

from __future__ import annotations

import numpy as np

MAGIC = b"CGXQ"
VERSION = 1
HEADER_BYTES = 24
DTYPE_CODES = {"float32": 0, "float16": 1, "bfloat16": 2}
DTYPE_NAMES = {v: k for k, v in DTYPE_CODES.items()}
ELEM_SIZE = {"float32": 4, "float16": 2, "bfloat16": 2}
FLAG_RAW_TAIL = 1
FLAG_STOCHASTIC = 2
FLAG_CLIPPED = 4
# FORMAT.md "Clipped range": the clipped width per bit width, in standard deviations.
CLIP_SIGMAS = [0.0, 1.5958, 2.9872, 4.1024, 5.0278, 5.8326, 6.5559, 7.2247, 7.8412]
FLT_MAX = float(np.finfo(np.float32).max)
NAN_BITS = 0x7FC00000

M64 = (1 << 64) - 1
M32 = (1 << 32) - 1


# ---- the stochastic-rounding generator ---------------------------------------------------------


def splitmix64(x: int) -> int:
    x = (x + 0x9E3779B97F4A7C15) & M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & M64
    return x ^ (x >> 31)


def fmix32(h: int) -> int:
    h ^= h >> 16
    h = (h * 0x85EBCA6B) & M32
    h ^= h >> 13
    h = (h * 0xC2B2AE35) & M32
    h ^= h >> 16
    return h


def rng_key(seed: int, stream: int) -> tuple[int, int]:
    key = splitmix64(splitmix64(seed) ^ stream)
    return key & M32, key >> 32


def uniform(seed: int, stream: int, i: int) -> float:
    """u(seed, stream, i) of FORMAT.md, literally, on Python ints."""
    k0, k1 = rng_key(seed, stream)
    lo, hi = i & M32, (i >> 32) & M32
    h = fmix32((fmix32(lo ^ k0) + (k1 ^ ((hi * 0x9E3779B1) & M32))) & M32)
    return (h >> 8) * 2.0**-24


def _fmix32_array(h: np.ndarray) -> np.ndarray:
    h = h ^ (h >> np.uint32(16))
    h = h * np.uint32(0x85EBCA6B)
    h = h ^ (h >> np.uint32(13))
    h = h * np.uint32(0xC2B2AE35)
    return h ^ (h >> np.uint32(16))


def uniform_array(seed: int, stream: int, index: np.ndarray) -> np.ndarray:
    """u(seed, stream, i) for an array of element indices, as float32 (exact: 24 bits)."""
    k0, k1 = rng_key(seed, stream)
    index = np.asarray(index, dtype=np.uint64)
    lo = (index & np.uint64(M32)).astype(np.uint32)
    hi = (index >> np.uint64(32)).astype(np.uint32)
    h = _fmix32_array(
        _fmix32_array(lo ^ np.uint32(k0)) + (np.uint32(k1) ^ (hi * np.uint32(0x9E3779B1)))
    )
    return (h >> np.uint32(8)).astype(np.float32) * np.float32(2.0**-24)


# ---- dtype helpers -----------------------------------------------------------------------------


def to_f32(raw: np.ndarray, dtype: str) -> np.ndarray:
    """Exact conversion of raw input values to float32."""
    if dtype == "float32":
        return np.asarray(raw, dtype=np.float32)
    if dtype == "float16":
        return np.asarray(raw, dtype=np.uint16).view(np.float16).astype(np.float32)
    if dtype == "bfloat16":
        return (np.asarray(raw, dtype=np.uint16).astype(np.uint32) << np.uint32(16)).view(
            np.float32
        )
    raise ValueError(dtype)


def raw_bytes(raw: np.ndarray, dtype: str) -> bytes:
    if dtype == "float32":
        return np.asarray(raw, dtype="<f4").tobytes()
    return np.asarray(raw, dtype="<u2").tobytes()


def encoded_size(n: int, bits: int, bucket: int, dtype: str = "float32", raw_tail: bool = False):
    nq = n - n % bucket if raw_tail else n
    nb = -(-nq // bucket)
    return HEADER_BYTES + 8 * nb + -(-(nq * bits) // 8) + (n - nq) * ELEM_SIZE[dtype]


def header(dtype: str, bits: int, flags: int, bucket: int, count: int) -> bytes:
    return (
        MAGIC
        + bytes([VERSION, DTYPE_CODES[dtype], bits, flags])
        + int(bucket).to_bytes(4, "little")
        + (0).to_bytes(4, "little")
        + int(count).to_bytes(8, "little")
    )


def pack_codes(q: np.ndarray, bits: int) -> bytes:
    """Little-endian bit stream: bit j of code i is stream bit i*bits + j."""
    q = np.asarray(q, dtype=np.uint8)
    stream = (q[:, None] >> np.arange(bits, dtype=np.uint8)) & np.uint8(1)
    return np.packbits(stream.reshape(-1), bitorder="little").tobytes()


def unpack_codes(data: bytes, count: int, bits: int) -> np.ndarray:
    stream = np.unpackbits(np.frombuffer(data, dtype=np.uint8), bitorder="little")
    stream = stream[: count * bits].reshape(count, bits).astype(np.int64)
    return (stream << np.arange(bits)).sum(axis=1).astype(np.uint8)


# ---- encoding ----------------------------------------------------------------------------------


def _buckets(x: np.ndarray, bucket: int) -> np.ndarray:
    """(nb, bucket) view of x; the short last bucket is padded with its own last element, which
    changes neither its minimum, nor its maximum, nor its finiteness."""
    bucket = min(bucket, x.size)  # one bucket: no padding (bucket sizes go up to 2^32 - 1)
    nb = -(-x.size // bucket)
    pad = nb * bucket - x.size
    if pad:
        x = np.concatenate([x, np.full(pad, x[-1], dtype=x.dtype)])
    return x.reshape(nb, bucket)


def _lane_sums(v: np.ndarray) -> np.ndarray:
    """FORMAT.md's fp64 sum per bucket (row of ``v``, padding already 0): lane j adds elements
    j, j + 8, ... in order (cumsum is sequential), then lanes 0..7 are added in order."""
    nb, width = v.shape
    padded = np.zeros((nb, -(-width // 8) * 8))
    padded[:, :width] = v
    lanes = np.cumsum(padded.reshape(nb, -1, 8), axis=1)[:, -1, :]
    total = np.zeros(nb)
    for j in range(8):
        total = total + lanes[:, j]
    return total


def _clip(X, n, bucket, bits, finite, mn, mx, rng):
    """FORMAT.md "Clipped range": (mn, range) per bucket after narrowing."""
    count = np.minimum(X.shape[1], n - np.arange(X.shape[0]) * X.shape[1]).astype(np.float64)
    real = np.arange(X.shape[1])[None, :] < count[:, None]  # not the padding of _buckets
    ok = finite & (rng > 0) & (count == bucket)  # full buckets only
    X64 = np.where(real & ok[:, None], X.astype(np.float64), 0.0)
    mean = _lane_sums(X64) / count
    dev = np.where(real & ok[:, None], X64 - mean[:, None], 0.0)
    want = CLIP_SIGMAS[bits] * np.sqrt(_lane_sums(dev * dev) / count)
    use = ok & (want > 0) & (want < rng)
    lo = np.maximum(
        mn.astype(np.float64), np.minimum(mean - want / 2, mx.astype(np.float64) - want)
    )
    return np.where(use, lo.astype(np.float32), mn), np.where(use, want, rng)


def quantize(
    x: np.ndarray,
    bits: int,
    bucket: int,
    stochastic: bool = False,
    seed: int = 0,
    stream: int = 0,
    clip: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """FORMAT.md "Encoding one bucket" for the quantized elements ``x`` (float32).

    Returns (metadata as an (nb, 2) uint32 array of float32 bit patterns, codes as uint8)."""
    n = x.size
    L = (1 << bits) - 1
    if n == 0:
        return np.zeros((0, 2), np.uint32), np.zeros(0, np.uint8)
    X = _buckets(np.asarray(x, np.float32), bucket)
    with np.errstate(all="ignore"):
        finite = np.isfinite(X).all(axis=1)
        mn = X.min(axis=1)
        mx = X.max(axis=1)
        rng = full = mx.astype(np.float64) - mn.astype(np.float64)
        if clip:
            mn, rng = _clip(X, n, bucket, bits, finite, mn, mx, rng)
        # A step that overflows fp32 (bits=1, range > FLT_MAX) makes the bucket non-finite.
        finite &= ~(np.where(finite, rng, 0.0) / L > FLT_MAX)
        mn = np.where(mn == 0, np.float32(0), mn).astype(np.float32)  # +0 minimum
        regular = finite & (rng > 0)  # neither non-finite nor constant
        safe = np.where(regular, rng, 1.0)
        unit = (safe / L).astype(np.float32)
        inv = L / safe  # fp64
        f32_path = (np.where(regular, full, 1.0) <= FLT_MAX) & (inv <= FLT_MAX)

        if stochastic:
            r32 = uniform_array(seed, stream, np.arange(X.size, dtype=np.uint64)).reshape(X.shape)
        else:
            r32 = np.full(X.shape, 0.5, np.float32)
        # fp32 path: t = (x - mn) * (f32)inv, then t + r, each rounded to fp32.
        t32 = (X - mn[:, None]) * inv.astype(np.float32)[:, None]
        s32 = (t32 + r32).astype(np.float64)
        # fp64 path: t = ((f64)x - (f64)mn) * inv, then t + r, in fp64.
        t64 = (X.astype(np.float64) - mn.astype(np.float64)[:, None]) * inv[:, None]
        s64 = t64 + r32.astype(np.float64)
        s = np.where(f32_path[:, None], s32, s64)
        q = np.clip(np.floor(s), 0, L)
        q = np.where(regular[:, None], q, 0).astype(np.uint8).reshape(-1)[:n]

    meta = np.empty((X.shape[0], 2), np.uint32)
    meta[:, 0] = mn.view(np.uint32)
    meta[:, 1] = np.where(regular, unit, np.float32(0)).view(np.uint32)
    meta[~finite] = NAN_BITS
    return meta, q


def encode(
    raw: np.ndarray,
    dtype: str,
    bits: int,
    bucket: int,
    stochastic: bool = False,
    seed: int = 0,
    stream: int = 0,
    raw_tail: bool = False,
    clip: bool = False,
) -> bytes:
    """The payload of FORMAT.md for the raw input values ``raw`` (1-D) of dtype ``dtype``."""
    n = raw.size
    nq = n - n % bucket if raw_tail else n
    x = to_f32(raw, dtype)
    meta, q = quantize(x[:nq], bits, bucket, stochastic, seed, stream, clip)
    flags = (FLAG_RAW_TAIL if raw_tail else 0) | (FLAG_STOCHASTIC if stochastic else 0)
    flags |= FLAG_CLIPPED if clip else 0
    return (
        header(dtype, bits, flags, bucket, n)
        + meta.astype("<u4").tobytes()
        + pack_codes(q, bits)
        + raw_bytes(raw[nq:], dtype)
    )


# ---- decoding ----------------------------------------------------------------------------------


def parse_header(payload: bytes) -> dict:
    return {
        "dtype": DTYPE_NAMES[payload[5]],
        "bits": payload[6],
        "flags": payload[7],
        "bucket_size": int.from_bytes(payload[8:12], "little"),
        "count": int.from_bytes(payload[16:24], "little"),
    }


def decode(payload: bytes) -> np.ndarray:
    """x' of FORMAT.md "Decoding one element" for every element, as float32.

    The payload is assumed valid (header and length); metadata and codes may be anything."""
    h = parse_header(payload)
    n, bits, bucket, dtype = h["count"], h["bits"], h["bucket_size"], h["dtype"]
    L = (1 << bits) - 1
    nq = n - n % bucket if h["flags"] & FLAG_RAW_TAIL else n
    nb = -(-nq // bucket)
    meta_end = HEADER_BYTES + 8 * nb
    codes_end = meta_end + -(-(nq * bits) // 8)
    meta = np.frombuffer(payload[HEADER_BYTES:meta_end], dtype="<f4").reshape(nb, 2)
    q = unpack_codes(payload[meta_end:codes_end], nq, bits)
    k = np.arange(nq) // bucket
    mn = meta[k, 0].astype(np.float32)
    unit = meta[k, 1].astype(np.float32)
    with np.errstate(all="ignore"):
        narrow = np.abs(meta[:, 0].astype(np.float64)) + L * np.abs(meta[:, 1].astype(np.float64))
        f32_path = (narrow <= FLT_MAX)[k]
        x32 = mn + q.astype(np.float32) * unit
        x64 = (mn.astype(np.float64) + q.astype(np.float64) * unit.astype(np.float64)).astype(
            np.float32
        )
    out = np.where(f32_path, x32, x64).astype(np.float32)
    elem = ELEM_SIZE[dtype]
    tail = np.frombuffer(
        payload[codes_end : codes_end + (n - nq) * elem], dtype="<f4" if elem == 4 else "<u2"
    )
    return np.concatenate([out, to_f32(tail, dtype)]).astype(np.float32)


def error_bound(x: np.ndarray, bits: int, bucket: int) -> np.ndarray:
    """FORMAT.md "Error bound" of every element of ``x`` (finite, float32), computed per bucket
    in fp64 with the real ``unit = (mx - mn) / L``."""
    L = (1 << bits) - 1
    if x.size == 0:
        return np.zeros(0)
    X = _buckets(np.asarray(x, np.float32), bucket).astype(np.float64)
    mn, mx = X.min(axis=1), X.max(axis=1)
    unit = (mx - mn) / L
    bound = (
        unit * (0.5 + 4 * L * 2.0**-24)
        + 2.0**-23 * np.maximum(np.abs(mn), np.abs(mx))
        + 2.0**-149 * (L + 1)
    )
    return np.repeat(bound, min(bucket, x.size))[: x.size]
