"""Checks that a written picture is a valid, non-trivial PNG or SVG."""

from __future__ import annotations

import struct
import xml.etree.ElementTree as ET
from pathlib import Path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"


def png_size(path: Path) -> tuple[int, int]:
    """Width and height in pixels of a valid PNG (asserts the signature and header)."""
    data = path.read_bytes()
    assert data[:8] == PNG_SIGNATURE, f"{path} is not a PNG"
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    assert 200 <= width <= 16000 and 200 <= height <= 16000, (width, height)
    assert len(data) > 5_000
    return width, height


def svg_text(path: Path) -> str:
    """All text of a valid SVG (asserts it parses as XML with an <svg> root)."""
    root = ET.parse(path).getroot()
    assert root.tag.endswith("svg")
    return " ".join(t for t in root.itertext() if t.strip())
