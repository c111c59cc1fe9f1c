"""Where AxoNN's 2-D grid pays off against the 1-D layout (outcore.cost.grid), on the A100
preset: inside one NVLink node 1-D wins; across nodes a grid whose column groups stay inside a
node moves 1/rows of the activation over InfiniBand and wins."""

from __future__ import annotations

import pytest

from outcore.cost.grid import best_grid, grids, pair_grid_s
from outcore.hardware.collectives import allreduce_s
from outcore.hardware.presets import device_preset, link_preset
from outcore.hardware.spec import Cluster


def a100(tp: int) -> Cluster:
    return Cluster(device=device_preset("a100"), nodes=max(tp // 8, 1),
                   devices_per_node=min(tp, 8), intra=link_preset("nvlink3"),
                   inter=link_preset("ib-hdr"), nics_per_node=8)


def test_every_factorisation_is_a_candidate():
    assert grids(8) == [(1, 8), (2, 4), (4, 2), (8, 1)]
    assert [(c.rows, c.cols) for c in best_grid(6, 64, 32, 128, a100(8))].count((2, 3)) == 1


def test_one_d_is_two_all_reduces_of_the_activation():
    cl = a100(8)
    c = pair_grid_s(2048, 8192, 32768, 1, 8, cl)
    assert c.comm_s == pytest.approx(2 * allreduce_s(2048 * 8192 * 2, 8, cl.intra))


def test_inside_a_node_one_d_wins():
    costs = best_grid(8, 2048, 8192, 32768, a100(8))
    assert (costs[0].rows, costs[0].cols) == (1, 8)


@pytest.mark.parametrize("tp", [16, 32])
def test_across_nodes_a_grid_with_node_local_columns_wins(tp):
    costs = best_grid(tp, 2048, 8192, 32768, a100(tp))
    one = next(c for c in costs if c.rows == 1)
    assert costs[0].rows > 1 and costs[0].cols <= 8
    assert one.total_s > 1.15 * costs[0].total_s


def test_grid_note_names_the_faster_grid_across_nodes():
    """grid_note on a layout's largest pair: across A100 nodes (tp 16) a grid with node-local
    columns is named with its speed-up and the API call; inside a node 1-D stays."""
    from outcore.cost.grid import grid_note, pair_comm_s
    from outcore.graph.tensor_pairs import Pair, Split, TensorLayout

    tokens, hidden, width = 2048, 8192, 32768
    act, mid = tokens * hidden * 2, tokens * width * 2

    def layout(tp):
        pair = Pair(columns=("fc1",), rows=("fc2",), region=(1,), heads=None,
                    param_bytes=2 * hidden * width * 2, out_bytes=act, in_bytes=act)
        splits = (Split(module="fc1", kind="linear", style="colwise", node=0, param_bytes=1,
                        out_bytes=mid, pair=0),
                  Split(module="fc2", kind="linear", style="rowwise", node=2, param_bytes=1,
                        in_bytes=mid, out_bytes=act, pair=0))
        return TensorLayout(tp=tp, pairs=(pair,), splits=splits)

    across = grid_note(layout(16), a100(16))
    best = min((pair_comm_s(act, mid, r, 16 // r, a100(16)), r) for r in (2, 4, 8))
    assert f"a {best[1]} x {16 // best[1]} grid" in across and 'mode="2d"' in across
    assert "no row x column grid" in grid_note(layout(8), a100(8))
    assert grid_note(TensorLayout(tp=16, pairs=(), splits=()), a100(16)) is None
