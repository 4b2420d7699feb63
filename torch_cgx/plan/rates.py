"""tc-style link rates and times ("1gbit", "125mbps", "200us"), parsed for the planner.

The planner reads a link given as text (``LinkCosts.parse``, the planner's command line); the
emulated-hosts harness under benchmarks/ shapes its links with the same syntax and imports these
parsers from here, so that both read a rate alike (the package never imports the benchmarks).
"""

from __future__ import annotations

import re

# tc's units: "bit" suffixes count bits, "bps" suffixes count bytes (tc's own reading of "bps").
_RATE_UNITS = {
    "bit": 1,
    "kbit": 10**3,
    "mbit": 10**6,
    "gbit": 10**9,
    "tbit": 10**12,
    "bps": 8,
    "kbps": 8 * 10**3,
    "mbps": 8 * 10**6,
    "gbps": 8 * 10**9,
}
_TIME_UNITS = {"us": 1e-6, "usec": 1e-6, "ms": 1e-3, "msec": 1e-3, "s": 1.0, "sec": 1.0}
_NUMBER_UNIT = re.compile(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*")
# tbf cannot shape below about one byte per ms; a smaller rate is a typo (a missing unit prefix).
MIN_RATE_BITS = 8000


def parse_rate_bits(text: str) -> int:
    """tc-style rate -> bit/s: "100mbit", "1gbit", "10Gbit", "125mbps" (bytes/s, as in tc)."""
    m = _NUMBER_UNIT.fullmatch(str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _RATE_UNITS:
        raise ValueError(f"not a rate: {text!r} (examples: 100mbit, 1gbit, 10gbit)")
    bits = int(float(m.group(1)) * _RATE_UNITS[unit])
    if bits < MIN_RATE_BITS:
        raise ValueError(f"rate too small: {text!r}")
    return bits


def parse_time(text: str) -> float:
    """tc-style time -> seconds: "1ms", "200us", "0.5s"."""
    m = _NUMBER_UNIT.fullmatch(str(text))
    unit = m.group(2).lower() if m else ""
    if not m or unit not in _TIME_UNITS:
        raise ValueError(f"not a time: {text!r} (examples: 200us, 1ms, 10ms)")
    return float(m.group(1)) * _TIME_UNITS[unit]
