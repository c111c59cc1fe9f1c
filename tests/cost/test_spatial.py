"""Tile geometry and spatial costs: hand-checked cases and brute-force properties (no torch)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from outcore.cost.spatial import (
    LayerGeometry,
    bn_allreduce_bytes,
    gather_bytes,
    halo_bytes,
    output_hw,
    tile_activation_bytes,
    tile_halos,
)
from outcore.cost.spatial_geometry import (
    TileGrid,
    conv_need,
    conv_out_size,
    conv_transpose_need,
    conv_transpose_out_size,
    intervals,
    pool_divisors,
    split_sizes,
)
from outcore.errors import UsageError


def test_split_sizes_unequal_tiles_first_ones_larger():
    assert split_sizes(30, 4) == [8, 8, 7, 7]
    assert intervals(15, 2) == [(0, 8), (8, 15)]
    with pytest.raises(UsageError, match="join the tiles before"):
        split_sizes(3, 4)


def test_grid_parse_and_regions():
    g = TileGrid.parse("2x2")
    assert (g.rows, g.cols, g.tiles) == (2, 2, 4)
    assert TileGrid.parse("4") == TileGrid(rows=4, cols=1)
    assert g.coords(3) == (1, 1)
    assert g.region(3, 30, 34) == (15, 30, 17, 34)
    with pytest.raises(UsageError):
        TileGrid.parse("2y2")


def test_conv_3x3_same_halo_is_one_row_and_column():
    conv = LayerGeometry(kind="conv", kernel=(3, 3), padding=(1, 1))
    g = TileGrid(rows=2, cols=2)
    # tile 0 owns rows [0,15) cols [0,17): needs row 15 below and column 17 to its right
    assert tile_halos(conv, (30, 34), g) == [(0, 1, 0, 1), (0, 1, 1, 0), (1, 0, 0, 1),
                                             (1, 0, 1, 0)]
    # rows: 1 x 17 cols x 8 ch x 2 images x 4 B = 1088; cols: 1 x 16 rows held x 8 x 2 x 4 = 1024
    assert halo_bytes(conv, 2, 8, (30, 34), g) == [2112] * 4


def test_stride_2_halo_is_one_sided():
    # 15 rows on 2 tiles: [0,8) and [8,15); 8 output rows: [0,4), [4,8)
    conv = LayerGeometry(kind="conv", kernel=(3, 3), stride=(2, 2), padding=(1, 1))
    assert output_hw(conv, (15, 15)) == (8, 8)
    assert conv_need(0, 4, 3, 2, 1) == (-1, 8)     # row -1 is padding: no halo
    assert conv_need(4, 8, 3, 2, 1) == (7, 16)     # row 7 from tile 0, row 15 is padding
    assert [h[:2] for h in tile_halos(conv, (15, 15), TileGrid(rows=2, cols=1))] == \
        [(0, 0), (1, 0)]


def test_large_dilation_reaches_past_the_neighbour():
    conv = LayerGeometry(kind="conv", kernel=(5, 1), padding=(6, 0), dilation=(3, 1))
    # 13 rows on 4 tiles: 4,3,3,3; tile 1 owns [4,7) and reads [4-6, 7+6) = [-2, 13)
    assert [h[:2] for h in tile_halos(conv, (13, 5), TileGrid(rows=4, cols=1))] == \
        [(0, 6), (4, 6), (6, 3), (6, 0)]


def test_pointwise_and_batchnorm_have_no_halo_gather_and_activations():
    g = TileGrid(rows=1, cols=4)
    assert halo_bytes(LayerGeometry(kind="pointwise"), 2, 8, (30, 34), g) == [0] * 4
    assert halo_bytes(LayerGeometry(kind="batchnorm"), 2, 8, (30, 34), g) == [0] * 4
    assert bn_allreduce_bytes(8) == 64
    # 34 cols on 4 tiles: 9, 9, 8, 8; each tile 30 rows x cols x 8 ch x 2 x 4 B
    assert tile_activation_bytes(2, 8, (30, 34), g) == [17280, 17280, 15360, 15360]
    # all-gather pads every tile to 30 x 9: 3 x 270 x 8 x 2 x 4
    assert gather_bytes(2, 8, (30, 34), g) == 51840


def test_transposed_conv_and_upsample_sizes():
    up = LayerGeometry(kind="conv_transpose", kernel=(2, 2), stride=(2, 2),
                       output_padding=(1, 1))
    assert output_hw(up, (7, 8)) == (15, 17)
    assert conv_transpose_out_size(7, 2, 2, 0, 1, 1) == 15
    # output rows [8, 15) come from inputs 4..6 (input i writes 2i, 2i+1)
    assert conv_transpose_need(8, 15, 7, 2, 2) == (4, 7)
    near = LayerGeometry(kind="upsample", factor=(2, 2))
    assert output_hw(near, (15, 17)) == (30, 34)
    # 30 rows on 2 tiles [0,15), [15,30): tile 1 reads input rows [7, 15) of [0,8), [8,15)
    assert [h[:2] for h in tile_halos(near, (15, 17), TileGrid(rows=2, cols=1))] == \
        [(0, 0), (1, 0)]
    bil = LayerGeometry(kind="upsample", factor=(2, 2), bilinear=True)
    assert [h[:2] for h in tile_halos(bil, (15, 17), TileGrid(rows=2, cols=1))] == \
        [(0, 0), (1, 0)]


def test_avg_pool_divisors_match_pytorch_rules():
    # n=8, k=3, s=2, p=1, ceil_mode: windows start at -1, 1, 3, 5, 7 (the last reaches 10 > 9)
    assert pool_divisors(0, 5, 8, 3, 2, 1, True) == [3, 3, 3, 3, 2]
    assert pool_divisors(0, 5, 8, 3, 2, 1, False) == [2, 3, 3, 3, 1]
    assert conv_out_size(8, 3, 2, 1, 1, ceil_mode=True) == 5


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 60), parts=st.integers(1, 5), k=st.integers(1, 6), s=st.integers(1, 4),
       p=st.integers(0, 3), d=st.integers(1, 3), ceil=st.booleans())
def test_tiles_read_exactly_the_serial_windows(n, parts, k, s, p, d, ceil):
    """Brute force: the rows that the windows of a tile's outputs read are exactly its need."""
    if p > d * (k - 1) // 2 + 1 or n + 2 * p < d * (k - 1) + 1:
        return
    out = conv_out_size(n, k, s, p, d, ceil)
    if out < parts:
        return
    tiles = intervals(out, parts)
    assert tiles[0][0] == 0 and tiles[-1][1] == out
    for o0, o1 in tiles:
        rows = {o * s - p + j * d for o in range(o0, o1) for j in range(k)}
        lo, hi = conv_need(o0, o1, k, s, p, d)
        assert lo == min(rows) and hi == max(rows) + 1


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 40), parts=st.integers(1, 4), k=st.integers(1, 5), s=st.integers(1, 4),
       p=st.integers(0, 2), d=st.integers(1, 2), op=st.integers(0, 3))
def test_transposed_need_covers_every_contributing_input(n, parts, k, s, p, d, op):
    if op >= max(s, d) or p > d * (k - 1):
        return
    out = conv_transpose_out_size(n, k, s, p, d, op)
    if out < parts:
        return
    for o0, o1 in intervals(out, parts):
        src = {i for i in range(n) for j in range(k) if o0 <= i * s - p + j * d < o1}
        lo, hi = conv_transpose_need(o0, o1, n, k, s, p, d)
        assert all(lo <= i < hi for i in src)
        if src and d == 1:   # with dilation the interval may hold inputs that skip the tile
            assert lo == min(src) and hi == max(src) + 1


def test_chain_costs_hand_checked():
    from outcore.cost.spatial import chain_costs
    conv = LayerGeometry(kind="conv", kernel=(3, 3), padding=(1, 1))
    pool = LayerGeometry(kind="conv", kernel=(2, 2), stride=(2, 2))
    bn = LayerGeometry(kind="batchnorm")
    gap = LayerGeometry(kind="global_pool")
    g = TileGrid(rows=2, cols=1)
    costs = chain_costs([(conv, 3, 8), (bn, 8, 8), (pool, 8, 8), (gap, 8, 8)], 1, (30, 34), g)
    c0, c1, c2, c3 = costs
    # conv: tile rows [0,15) read [-1,16) = 17 rows x 36 padded cols x 3 ch x 4 B = 7344;
    # output 15 x 34 x 8 x 4 = 16320; halo one row of 34 cols x 3 ch x 4 B = 408
    assert (c0.region_bytes, c0.out_bytes, c0.halo_bytes) == (7344, 16320, 408)
    assert (c1.region_bytes, c1.allreduce_bytes, c1.halo_bytes) == (0, 64, 0)
    # pool on 30 x 34 -> 15 x 17: output tiles [0,8), [8,15) read input rows [0,16), [16,30),
    # so tile 0 (owning input rows [0,15)) takes row 15 from tile 1: the window crosses the
    # border; region 16 x 34 x 8 x 4 = 17408, halo 1 x 34 x 8 x 4 = 1088, output 8x17x8x4 = 4352
    assert (c2.out_hw, c2.region_bytes, c2.halo_bytes, c2.out_bytes) == ((15, 17), 17408, 1088,
                                                                         4352)
    assert (c3.out_hw, c3.out_bytes) == ((1, 1), 32)
