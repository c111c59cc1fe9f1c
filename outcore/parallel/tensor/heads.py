"""Attention modules split by heads read their head count at run time: :func:`divide_heads`
makes them see the local count on each tensor-parallel rank."""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

log = logging.getLogger(__name__)

__all__ = ["HEAD_ATTRS", "WIDTH_ATTRS", "divide_heads"]

HEAD_ATTRS = ("heads", "num_heads", "n_head", "n_heads", "num_attention_heads",
              "num_key_value_heads", "nhead", "num_kv_heads")
WIDTH_ATTRS = ("all_head_size", "inner_dim", "attn_dim")


def divide_heads(model: nn.Module, pair: Any, tp: int) -> None:
    """Attention modules that read their head count (``self.num_heads``) to reshape must see
    the local count once their projections are split by heads: divide it in the lowest common
    ancestor of the pair (only that module's own attributes; shared configs are not touched),
    and a width attribute equal to a projection's (or a fused one's chunk's) width."""
    columns, rows = pair.columns, pair.rows
    parents = [p.rpartition(".")[0].split(".") for p in columns + rows]
    common: list[str] = []
    for level in zip(*parents):
        if len(set(level)) > 1:
            break
        common.append(level[0])
    owner = model.get_submodule(".".join(common).strip("."))
    widths = {model.get_submodule(p).out_features // k
              for p, k in zip(columns, pair.chunks or (1,) * len(columns))
              if isinstance(model.get_submodule(p), nn.Linear)}
    for attr in HEAD_ATTRS + WIDTH_ATTRS:
        value = owner.__dict__.get(attr)
        if isinstance(value, int) and not isinstance(value, bool) and value % tp == 0 and \
                (attr in HEAD_ATTRS or value in widths):
            setattr(owner, attr, value // tp)
            log.debug("%s.%s: %d -> %d", type(owner).__name__, attr, value, value // tp)

