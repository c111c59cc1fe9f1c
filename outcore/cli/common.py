"""Shared CLI pieces: model arguments, unit arguments, console output."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from outcore.errors import UsageError

console = Console(stderr=False, highlight=False)
err_console = Console(stderr=True, highlight=False)

MODEL_HELP = ("the model: torchvision:<builder> (e.g. torchvision:resnet50), outcore:<zoo model>"
              " (resnet_k, wide_resnet, amoebanet, transformer, lstm_lm, mlp, diamond, "
              "two_tower; options after a colon: outcore:resnet_k:depth=110), timm:<name> "
              "(timm:vit_tiny_patch16_224:image_size=64), hf:<Hugging Face model type> (tiny "
              "random config; hf:llama:num_hidden_layers=4; docs/models.md), or "
              "path/to/file.py:function returning a module or (module, example_input)")


def add_model_args(p: argparse.ArgumentParser, *, required: bool = True) -> None:
    p.add_argument("model", nargs=None if required else "?", help=MODEL_HELP)
    p.add_argument("--input-shape", metavar="SHAPE",
                   help="example input shape, batch first: 8x3x224x224 (default: the model's own)")
    p.add_argument("--batch-size", type=int, metavar="N",
                   help="batch size (overrides the first dimension of --input-shape)")


def positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {v}")
    return v


def add_mesh_args(p: argparse.ArgumentParser) -> None:
    """``--tp``, ``--shard`` and ``--sp`` (with ``--sp-join``, ``--sp-grid``): the tensor,
    sharding and spatial degrees of the plan's process mesh (``outcore plan`` and ``outcore
    train``)."""
    p.add_argument("--tp", type=tp_arg, default=0, metavar="N|auto",
                   help="tensor-parallel ranks per device slot: the Megatron layout of the "
                        "model's Linear and Embedding layers (column/row pairs found in the "
                        "graph) split over tp consecutive ranks, inside every stage; auto: "
                        "the fastest of 1, 2, 4, 8 that fits (the plan's notes say why); "
                        "--dp x --tp divides --devices (default 1, or the layout search's "
                        "choice when it chooses the layout); see docs/tensor.md")
    p.add_argument("--shard", type=tp_arg, default=0, metavar="N|auto",
                   help="sharded data parallelism (FSDP / ZeRO-3; AxoNN's depth dimension): N "
                        "of the --dp copies of every device slot hold 1/N of its parameters, "
                        "gradients and optimizer state each, gather a piece's parameters "
                        "before it runs and reduce-scatter its gradients; N divides --dp; "
                        "auto: the fastest divisor of --dp that fits (default: no sharding, "
                        "or the layout search's choice when it chooses the layout); see "
                        "docs/tensor.md")
    p.add_argument("--sp", type=positive_int, default=1,
                   help="spatial parallelism (MPI4DL SP + LP): the layers before the join run "
                        "on --sp image tiles, one rank each, with halo exchange; --devices "
                        "counts them (stages + sp - 1 ranks; default 1); see docs/spatial.md")
    p.add_argument("--sp-join", metavar="NODE",
                   help="the last node run on tiles (its output is gathered); default: the "
                        "planner's choice from the memory model")
    p.add_argument("--sp-grid", metavar="ROWSxCOLS",
                   help="tile grid, e.g. 2x2 (default: --sp tiles over the height)")


def degree_arg(value: int | None, layout_searched: bool) -> int | None:
    """The request's tensor-parallel or sharding degree from ``--tp`` / ``--shard`` (0: not
    given; None: ``auto``): not given means 1, unless the layout search runs, which then
    chooses it."""
    if value == 0:
        return None if layout_searched else 1
    return value


def tp_arg(text: str) -> int | None:
    """``--tp`` / ``--shard``: a positive integer, or ``auto`` (None: the planner chooses)."""
    return None if text == "auto" else positive_int(text)


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


def note(msg: str) -> None:
    err_console.print(msg)


def stdout_is_tty() -> bool:
    return sys.stdout.isatty()


LEAF_HELP = ("keep this module as one layer of the graph (not traced inside): a module path "
             "(layer1.0) or a module class name (BasicBlock: every module of that type); "
             "repeatable. Use it for modules torch.fx cannot trace, or to plan on coarser layers")


def add_leaf_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument("--leaf", action="append", default=[], metavar="MODULE", help=LEAF_HELP)
