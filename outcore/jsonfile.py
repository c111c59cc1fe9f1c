"""Reading and writing outcore's JSON artifacts (graphs, plans, schedules): one place for the
atomic write and for the errors a user sees when a file is missing or not JSON."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from outcore.errors import FormatError

__all__ = ["read_json", "write_json"]


def write_json(path: str | os.PathLike, doc: Any, *, compact: bool = False) -> Path:
    """Write ``doc`` atomically (a temporary file, then a rename); ``compact`` drops the
    indentation (large graphs)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        json.dump(doc, f, separators=(",", ":") if compact else (", ", ": "),
                  indent=None if compact else 1)
    os.replace(tmp, path)
    return path


def read_json(path: str | os.PathLike, what: str) -> Any:
    """The JSON document in ``path``; :class:`FormatError` naming ``what`` (``plan file``) when
    it is missing or not valid JSON."""
    path = Path(path)
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        raise FormatError(f"{what} {str(path)!r} does not exist") from None
    except json.JSONDecodeError as e:
        raise FormatError(f"{path}: not valid JSON ({e.msg} at line {e.lineno})") from None
