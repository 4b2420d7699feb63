"""Byte sizes as nccl-tests writes them: 1K, 8M, 1G (powers of 1024)."""

from __future__ import annotations

_UNITS = {"": 1, "B": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    t = text.strip().upper()
    for suffix in ("IB", "B"):
        if t.endswith(suffix) and len(t) > len(suffix):
            t = t[: -len(suffix)]
            break
    unit = t[-1] if t and t[-1] in _UNITS else ""
    number = t[: len(t) - len(unit)]
    try:
        value = float(number) * _UNITS[unit]
    except ValueError:
        raise ValueError(f"not a size: {text!r} (examples: 4096, 64K, 8M, 1G)") from None
    if value < 0 or value != int(value):
        raise ValueError(f"not a size: {text!r}")
    return int(value)


def format_size(n: int) -> str:
    for unit in ("G", "M", "K"):
        if n >= _UNITS[unit] and n % _UNITS[unit] == 0:
            return f"{n // _UNITS[unit]}{unit}"
    return str(n)


def size_range(begin: int, end: int, factor: int) -> list:
    if begin <= 0 or end < begin or factor < 2:
        raise ValueError("need 0 < -b <= -e and -f >= 2")
    out, s = [], begin
    while s <= end:
        out.append(s)
        s *= factor
    return out
