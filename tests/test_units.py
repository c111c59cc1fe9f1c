import pytest

from outcore.errors import UsageError
from outcore.units import (
    format_bytes,
    format_seconds,
    parse_bandwidth,
    parse_bytes,
    parse_seconds,
    parse_shape,
)


@pytest.mark.parametrize("text,expected", [
    ("16GiB", 16 * 2**30), ("512MB", 512 * 10**6), ("1e9", 10**9), (1024, 1024),
    ("2 KiB", 2048), ("1.5GB", 1_500_000_000), ("80gib", 80 * 2**30), ("7", 7)])
def test_parse_bytes(text, expected):
    assert parse_bytes(text) == expected


@pytest.mark.parametrize("text,expected", [
    ("25us", 25e-6), ("1.5ms", 1.5e-3), ("2", 2.0), ("3s", 3.0), (0.5, 0.5), ("10ns", 1e-8)])
def test_parse_seconds(text, expected):
    assert parse_seconds(text) == pytest.approx(expected)


@pytest.mark.parametrize("text,expected", [
    ("16GB/s", 16e9), ("100Gb/s", 12.5e9), ("1e10", 1e10), ("1GiB/s", 2**30),
    ("500MB/s", 5e8)])
def test_parse_bandwidth(text, expected):
    assert parse_bandwidth(text) == pytest.approx(expected)


@pytest.mark.parametrize("bad", ["lots", "16XB", "-5GB", ""])
def test_bad_sizes_name_the_fix(bad):
    with pytest.raises(UsageError, match="GiB|unit|number"):
        parse_bytes(bad)


def test_bandwidth_needs_per_second():
    with pytest.raises(UsageError, match="per-second"):
        parse_bandwidth("16GB")


def test_shapes():
    assert parse_shape("8x3x224x224") == (8, 3, 224, 224)
    assert parse_shape("4,16") == (4, 16)
    with pytest.raises(UsageError, match="8x3x224x224"):
        parse_shape("8xfoo")
    with pytest.raises(UsageError, match="positive"):
        parse_shape("0x3")


def test_formatting():
    assert format_bytes(1536) == "1.50 KiB"
    assert format_bytes(3 * 2**30) == "3.00 GiB"
    assert format_bytes(12) == "12 B"
    assert format_seconds(1.93) == "1.93 s"
    assert format_seconds(0.0124) == "12.40 ms"
    assert format_seconds(35e-6) == "35.0 us"
