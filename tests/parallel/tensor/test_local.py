"""Tensor-parallel pieces that need no worker processes."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from outcore.errors import UsageError
from outcore.graph.tensor_pairs import find_layout
from outcore.parallel.tensor import auto_parallelize, depth_units, tensor_parallel
from outcore.parallel.tensor.export_graph import graph_from_export
from outcore.zoo.toy import mlp
from outcore.zoo.transformer import transformer


def test_needs_an_initialised_process_group():
    with pytest.raises(UsageError, match="init_process_group"):
        tensor_parallel(mlp(), 2)
    with pytest.raises(UsageError, match="unknown tensor-parallel mode"):
        tensor_parallel(mlp(), 2, mode="3d")


def test_auto_parallelize_restores_the_constructor_on_error():
    init = nn.Module.__init__
    with pytest.raises(RuntimeError, match="boom"):
        with auto_parallelize(2):
            nn.Linear(2, 2)
            raise RuntimeError("boom")
    assert nn.Module.__init__ is init


def test_depth_units_are_the_repeated_blocks():
    assert depth_units(transformer(layers=3)) == ["blocks.0", "blocks.1", "blocks.2"]
    assert depth_units(mlp(layers=2)) == ["layers.0", "layers.1"]
    assert depth_units(nn.Linear(4, 4)) == []


def test_export_graph_finds_the_same_pairs_as_fx():
    model = mlp(width=32, layers=4)
    g = graph_from_export(model, (torch.randn(4, 16),))
    lay = find_layout(g, 2, min_split_bytes=0)
    assert [(p.columns, p.rows) for p in lay.pairs] == [(("layers.0.0",), ("layers.1.0",)),
                                                        (("layers.2.0",), ("layers.3.0",))]
