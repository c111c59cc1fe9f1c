"""Tile reads of PNG and TIFF images (striped, tiled, planar, deflate, OME-TIFF pyramid level)
equal the same region of the whole image; a TIFF tile read touches only its segments."""

from __future__ import annotations

import numpy as np
import pytest

from outcore.cost.spatial_geometry import TileGrid
from outcore.errors import FormatError, UsageError
from outcore.parallel.spatial.images import TileImageFolder, image_size, read_region

tifffile = pytest.importorskip("tifffile")
Image = pytest.importorskip("PIL.Image")

H, W = 37, 45


@pytest.fixture()
def rgb():
    rng = np.random.default_rng(0)
    return rng.integers(0, 256, (H, W, 3), dtype=np.uint8)


def _write(kind, path, a):
    if kind == "png":
        Image.fromarray(a).save(path)
    elif kind == "png-gray":
        Image.fromarray(a[:, :, 0]).save(path)
    elif kind == "strips":
        tifffile.imwrite(path, a, rowsperstrip=8, photometric="rgb")
    elif kind == "tiles":
        tifffile.imwrite(path, a, tile=(16, 16), photometric="rgb")
    elif kind == "planar":
        tifffile.imwrite(path, np.moveaxis(a, -1, 0), tile=(16, 16), photometric="rgb",
                         planarconfig="separate")
    elif kind == "deflate-gray":
        tifffile.imwrite(path, a[:, :, 0], tile=(16, 32), compression="zlib")


KINDS = {"png": "a.png", "png-gray": "g.png", "strips": "s.tif", "tiles": "t.tif",
         "planar": "p.tiff", "deflate-gray": "d.ome.tif"}


@pytest.mark.parametrize("kind", list(KINDS))
@pytest.mark.parametrize("grid", ["2x2", "1x4", "3x1"])
def test_every_tile_equals_the_whole_images_region(tmp_path, rgb, kind, grid):
    path = tmp_path / KINDS[kind]
    _write(kind, path, rgb)
    whole = rgb if "gray" not in kind else rgb[:, :, :1]
    assert image_size(path) == (H, W, whole.shape[2])
    g = TileGrid.parse(grid)
    for t in range(g.tiles):
        r0, r1, c0, c1 = g.region(t, H, W)
        got = read_region(path, (r0, r1, c0, c1))
        np.testing.assert_array_equal(got, np.moveaxis(whole[r0:r1, c0:c1], -1, 0))


def test_tiled_tiff_reads_only_overlapping_segments(tmp_path, rgb, caplog):
    path = tmp_path / "t.tif"
    _write("tiles", path, rgb)            # 3 x 3 tiles of 16 x 16
    with caplog.at_level("DEBUG", logger="outcore.parallel.spatial.images"):
        read_region(path, (0, 10, 0, 10))
        read_region(path, (10, 20, 10, 40))    # tile rows 0..1 x tile cols 0..2
    assert "read 1 of 9 segments" in caplog.records[0].getMessage()
    assert "read 6 of 9 segments" in caplog.records[1].getMessage()   # rows 0-1, cols 0-2


def test_ome_tiff_pyramid_level(tmp_path, rgb):
    path = tmp_path / "slide.ome.tif"
    gray = rgb[:, :, 0]
    with tifffile.TiffWriter(path, ome=True) as tw:
        tw.write(gray, tile=(16, 16), subifds=1)
        tw.write(gray[::2, ::2], tile=(16, 16), subfiletype=1)
    np.testing.assert_array_equal(read_region(path, (3, 30, 5, 40))[0], gray[3:30, 5:40])


def test_folder_dataset_gives_my_tile_and_checks_sizes(tmp_path, rgb):
    for i in range(3):
        Image.fromarray(np.roll(rgb, i, axis=0)).save(tmp_path / f"img{i}.png")
    ds = TileImageFolder(tmp_path, TileGrid(rows=2, cols=2), 3, labels={"img1.png": 4})
    x, y = ds[1]
    assert tuple(x.shape) == (3, 18, 22) and y == 4
    np.testing.assert_allclose(x.numpy() * 255, np.moveaxis(np.roll(rgb, 1, 0)[19:, 23:], -1, 0),
                               atol=1e-4)
    Image.fromarray(rgb[:20]).save(tmp_path / "img9.png")
    with pytest.raises(FormatError, match="one image size"):
        ds2 = TileImageFolder(tmp_path, TileGrid(rows=2, cols=2), 0)
        ds2[len(ds2) - 1]
    with pytest.raises(UsageError, match="outside"):
        read_region(tmp_path / "img0.png", (0, 50, 0, 10))
