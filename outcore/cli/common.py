"""Shared CLI pieces: model arguments, unit arguments, console output."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from outcore.errors import UsageError

# piped output (a log file, CI) is not cut to 80 columns: tables keep one line per row
_WIDTH = None if sys.stdout.isatty() else int(os.environ.get("COLUMNS", "160"))
# no emoji codes: a model name such as hf:llama:... is text, not ":llama:"
console = Console(stderr=False, highlight=False, emoji=False, width=_WIDTH)
err_console = Console(stderr=True, highlight=False, emoji=False,
                      width=None if sys.stderr.isatty() else int(os.environ.get("COLUMNS", "160")))

MODEL_HELP = ("the model: torchvision:<builder> (e.g. torchvision:resnet50), outcore:<zoo model>"
              " (resnet_k, wide_resnet, amoebanet, transformer, lstm_lm, mlp, diamond, "
              "two_tower; options after a colon: outcore:resnet_k:depth=110), timm:<name> "
              "(timm:vit_tiny_patch16_224:image_size=64), hf:<Hugging Face model type> (tiny "
              "random config; hf:llama:num_hidden_layers=4; docs/models.md), or "
              "path/to/file.py:function returning a module or (module, example_input)")

def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v

def degree_arg(value: int | None, layout_searched: bool) -> int | None:
    """The request's tensor-parallel or sharding degree from ``--tp`` / ``--shard`` (0: not
    given; None: ``auto``): not given means 1, unless the layout search runs, which then
    chooses it."""
    if value == 0:
        return None if layout_searched else 1
    return value

def nonneg_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, got {v}")
    return v


def table(title: str, columns: list[str], rows: list[list[Any]]) -> Table:
    t = Table(title=title, title_justify="left")
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i == 0 else "right")
    for r in rows:
        t.add_row(*[str(x) for x in r])
    return t


def slot_label(slot: int, tp: int) -> str:
    """A plan's device slot as a table shows it: the device, or its tensor-parallel ranks."""
    return str(slot) if tp == 1 else f"{slot * tp}-{slot * tp + tp - 1}"


def check_output_suffix(path: str, allowed: tuple[str, ...]) -> Path:
    p = Path(path)
    if p.suffix.lower() not in allowed:
        raise UsageError(f"cannot write {path!r}: the file name must end in "
                         f"{', '.join(allowed)}")
    return p


def is_graph_file(text: str) -> bool:
    """A ``.json`` argument names a graph file (loading it reports a missing file)."""
    return text.endswith(".json")


def plural(n: int, noun: str) -> str:
    """``1 device``, ``2 devices``, ``1 micro-batch``, ``4 micro-batches``."""
    if n == 1:
        return f"1 {noun}"
    return f"{n} {noun}{'es' if noun.endswith(('ch', 'sh', 's', 'x')) else 's'}"


def note(msg: str) -> None:
    err_console.print(msg)
