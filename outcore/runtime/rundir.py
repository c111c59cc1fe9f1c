"""Unique run folders: two jobs started in the same second never share one."""

from __future__ import annotations

import os
import time
from pathlib import Path


def unique_run_dir(parent: str | os.PathLike, name: str) -> Path:
    """Create and return ``parent/<YYYYmmdd-HHMMSS>-<name>`` (``-2``, ``-3``, ... appended
    when taken). ``mkdir`` without ``exist_ok`` is atomic, so concurrent jobs cannot both get
    the same folder."""
    base = Path(parent) / f"{time.strftime('%Y%m%d-%H%M%S')}-{name}"
    base.parent.mkdir(parents=True, exist_ok=True)
    for n in range(1, 10_000):
        path = base if n == 1 else base.with_name(f"{base.name}-{n}")
        try:
            path.mkdir()
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"no free run folder named {base}-N")
