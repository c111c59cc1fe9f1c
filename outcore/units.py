"""Parse and format bytes, seconds and bandwidths, and name precisions.

A plain number means the base unit (bytes, seconds, bytes per second). Binary (KiB, MiB, GiB, TiB)
and decimal (KB, MB, GB, TB) byte suffixes are both accepted; ``GB/s`` is decimal bytes per second,
``Gb/s`` (lower-case b) is bits per second.
"""

from __future__ import annotations

import math
import re

from outcore.errors import UsageError

_BYTES = {
    "": 1, "b": 1,
    "k": 1e3, "kb": 1e3, "m": 1e6, "mb": 1e6, "g": 1e9, "gb": 1e9, "t": 1e12, "tb": 1e12,
    "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40,
}
_SECONDS = {"": 1.0, "s": 1.0, "ms": 1e-3, "us": 1e-6, "µs": 1e-6, "ns": 1e-9,
            "min": 60.0, "h": 3600.0}
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][-+]?[0-9]+)?)\s*([A-Za-zµ/]*)\s*$")


def _split(text: str | float | int, what: str, example: str) -> tuple[float, str]:
    if isinstance(text, (int, float)):
        return float(text), ""
    m = _NUMBER.match(str(text))
    if not m:
        raise UsageError(f"cannot read {what} {text!r}: write a number with an optional unit, "
                         f"e.g. {example}")
    return float(m.group(1)), m.group(2)


def parse_bytes(text: str | float | int) -> int:
    """Parse ``'16GiB'``, ``'512MB'``, ``'1e9'`` into a number of bytes."""
    value, unit = _split(text, "a size", "16GiB, 512MB or 1e9")
    factor = _BYTES.get(unit.lower())
    if factor is None:
        raise UsageError(f"unknown size unit {unit!r} in {text!r}: use B, KB, MB, GB, TB, "
                         "KiB, MiB, GiB or TiB")
    return int(round(value * factor))


def parse_seconds(text: str | float | int) -> float:
    """Parse ``'25us'``, ``'1.5ms'``, ``'2'`` into seconds."""
    value, unit = _split(text, "a duration", "25us, 1.5ms or 0.002")
    factor = _SECONDS.get(unit.lower() if unit != "µs" else unit)
    if factor is None:
        raise UsageError(f"unknown time unit {unit!r} in {text!r}: use ns, us, ms, s, min or h")
    return value * factor


def parse_bandwidth(text: str | float | int) -> float:
    """Parse ``'16GB/s'``, ``'100Gb/s'``, ``'1e10'`` into bytes per second."""
    value, unit = _split(text, "a bandwidth", "16GB/s, 100Gb/s or 1.6e10")
    if unit and not unit.endswith("/s"):
        raise UsageError(f"bandwidth {text!r} needs a per-second unit, e.g. 16GB/s")
    unit = unit[:-2]
    if unit.endswith("b") and not unit.endswith("ib") and unit not in ("", "b") and unit[:-1]:
        # bits per second: Gb/s, Mb/s
        factor = _BYTES.get(unit[:-1].lower() + "b")
        if factor is None:
            raise UsageError(f"unknown bandwidth unit in {text!r}")
        return value * factor / 8.0
    factor = _BYTES.get(unit.lower())
    if factor is None:
        raise UsageError(f"unknown bandwidth unit in {text!r}: use B/s, MB/s, GB/s, GiB/s or Gb/s")
    return value * factor


def format_bytes(n: float) -> str:
    """Format a byte count with a binary unit: ``1.50 GiB``."""
    if n is None or (isinstance(n, float) and math.isnan(n)):
        return "-"
    sign = "-" if n < 0 else ""
    n = abs(float(n))
    for unit, factor in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= factor:
            return f"{sign}{n / factor:.2f} {unit}"
    return f"{sign}{int(n)} B"


def format_seconds(s: float) -> str:
    """Format a duration: ``1.93 s``, ``12.4 ms``, ``35 us``."""
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return "-"
    a = abs(s)
    if a >= 100:
        return f"{s:.0f} s"
    if a >= 1:
        return f"{s:.2f} s"
    if a >= 1e-3:
        return f"{s * 1e3:.2f} ms"
    if a >= 1e-6:
        return f"{s * 1e6:.1f} us"
    if a == 0:
        return "0 s"
    return f"{s * 1e9:.0f} ns"


def format_bandwidth(bps: float) -> str:
    """Format bytes per second: ``16.0 GB/s``."""
    for unit, factor in (("TB/s", 1e12), ("GB/s", 1e9), ("MB/s", 1e6), ("KB/s", 1e3)):
        if bps >= factor:
            return f"{bps / factor:.1f} {unit}"
    return f"{bps:.0f} B/s"


def parse_shape(text: str) -> tuple[int, ...]:
    """Parse ``'8x3x224x224'`` (or ``8,3,224,224``) into a shape tuple."""
    parts = re.split(r"[x,×*]", str(text).strip().lower())
    try:
        shape = tuple(int(p) for p in parts)
    except ValueError:
        raise UsageError(f"cannot read input shape {text!r}: write sizes joined by 'x', "
                         "e.g. 8x3x224x224") from None
    if not shape or any(d <= 0 for d in shape):
        raise UsageError(f"input shape {text!r} must have positive sizes, e.g. 8x3x224x224")
    return shape


PRECISIONS = ("32", "bf16-mixed", "16-mixed")
_PRECISION_ALIASES = {"32-true": "32", "fp32": "32", "bf16": "bf16-mixed", "16": "16-mixed",
                      "fp16": "16-mixed"}


def parse_precision(text: object) -> str:
    """The canonical name of a precision (``32``, ``bf16-mixed``, ``16-mixed``; Lightning's
    aliases accepted)."""
    value = str(text).lower()
    value = _PRECISION_ALIASES.get(value, value)
    if value not in PRECISIONS:
        hint = " (outcore keeps float32 master weights: use bf16-mixed or 16-mixed)" \
            if value.endswith("-true") else ""
        raise UsageError(f"unknown precision {text!r}: use 32, bf16-mixed or 16-mixed{hint}")
    return value
