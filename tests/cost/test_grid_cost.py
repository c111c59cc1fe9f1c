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
