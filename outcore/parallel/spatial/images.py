"""Image sources for spatial parallelism: each rank reads only its own tile of each image.

TIFF (striped, tiled, OME-TIFF, as pathology slides come) is read through ``tifffile``: only the
strips or tiles that overlap the region are read from disk and decoded (compressed segments other
than deflate/LZW/packbits need ``imagecodecs``). PNG is one deflate stream and cannot be entered in
the middle: Pillow decodes rows from the top down to the region's last row and the region is cut
out, so the transient is ``row1 × width`` (the bottom tile's rank decodes nearly the whole image,
row by row; it never keeps more than the rows above its tile's bottom). For huge images use tiled
TIFF. Install the readers with the ``images`` extra (``pip install outcore[images]``).
"""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import torch

from outcore.cost.spatial_geometry import TileGrid
from outcore.errors import FormatError, UsageError

__all__ = ["image_size", "read_region", "TileImageFolder"]

log = logging.getLogger(__name__)

TIFF_SUFFIXES = (".tif", ".tiff")
PNG_SUFFIXES = (".png",)


def _tifffile():
    try:
        import tifffile
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise UsageError("reading TIFF needs tifffile: pip install 'outcore[images]'") from e
    return tifffile


def _kind(path: Path) -> str:
    name = path.name.lower()
    if name.endswith(TIFF_SUFFIXES):
        return "tiff"
    if name.endswith(PNG_SUFFIXES):
        return "png"
    raise FormatError(f"{path}: not a TIFF or PNG file (suffix {path.suffix!r}); convert it, "
                      f"e.g. to tiled TIFF with tifffile")


def image_size(path) -> tuple[int, int, int]:
    """(height, width, channels) without reading pixels."""
    path = Path(path)
    if _kind(path) == "tiff":
        with _tifffile().TiffFile(path) as tif:
            s, _, h, w, c = tif.pages[0].shaped
            return h, w, s * c
    from PIL import Image
    with Image.open(path) as im:
        return im.size[1], im.size[0], len(im.getbands())


def _tiff_region(path: Path, r0: int, r1: int, c0: int, c1: int, level: int) -> np.ndarray:
    """(C, r1-r0, c1-c0) from page ``level``, reading only the segments that overlap."""
    with _tifffile().TiffFile(path) as tif:
        page = tif.pages[level]
        planes, depth, h, w, samples = page.shaped
        if depth != 1:
            raise FormatError(f"{path}: volumetric TIFF (depth {depth}) is not supported")
        if page.is_tiled:
            seg_h, seg_w = page.tilelength, page.tilewidth
        else:
            seg_h, seg_w = min(page.rowsperstrip or h, h), w
        n_r, n_c = -(-h // seg_h), -(-w // seg_w)
        separate = page.planarconfig == 2
        wanted = [(s * n_r + i) * n_c + j for s in range(planes if separate else 1)
                  for i in range(r0 // seg_h, -(-r1 // seg_h))
                  for j in range(c0 // seg_w, -(-c1 // seg_w))]
        out = np.zeros((planes, r1 - r0, c1 - c0, samples), dtype=page.dtype)
        offsets = [page.dataoffsets[i] for i in wanted]
        counts = [page.databytecounts[i] for i in wanted]
        for data, index in tif.filehandle.read_segments(offsets, counts, indices=wanted):
            seg, (s, _, y, x, _), _ = page.decode(data, index, jpegtables=page.jpegtables)
            if seg is None:
                continue
            seg = seg[0]                                   # (rows, cols, samples)
            ya, yb = max(y, r0), min(y + seg.shape[0], r1)
            xa, xb = max(x, c0), min(x + seg.shape[1], c1)
            if ya < yb and xa < xb:
                out[s, ya - r0:yb - r0, xa - c0:xb - c0] = seg[ya - y:yb - y, xa - x:xb - x]
        log.debug("%s: region %s read %d of %d segments", path, (r0, r1, c0, c1), len(wanted),
                  len(page.dataoffsets))
    return np.moveaxis(out, -1, 1).reshape(planes * samples, r1 - r0, c1 - c0)


def _png_region(path: Path, r0: int, r1: int, c0: int, c1: int) -> np.ndarray:
    """(C, r1-r0, c1-c0): Pillow decodes rows 0 .. r1-1 only (see the module notes)."""
    from PIL import Image
    with Image.open(path) as im:
        w = im.size[0]
        tile = im.tile
        if len(tile) == 1 and im.format == "PNG" and not im.info.get("interlace"):
            im.tile = [tile[0]._replace(extents=(0, 0, w, r1))]
            im._size = (w, r1)
        im.load()
        arr = np.asarray(im)[r0:r1, c0:c1]
    arr = arr[:, :, None] if arr.ndim == 2 else arr
    return np.ascontiguousarray(np.moveaxis(arr, -1, 0))


def read_region(path, region: tuple[int, int, int, int], *, level: int = 0) -> np.ndarray:
    """Pixels ``rows [r0, r1) × cols [c0, c1)`` of an image as ``(channels, rows, cols)``, in
    the file's dtype; ``level`` is the TIFF page (pyramid level of an OME-TIFF series)."""
    path = Path(path)
    r0, r1, c0, c1 = region
    h, w, _ = image_size(path)
    if not (0 <= r0 < r1 <= h and 0 <= c0 < c1 <= w):
        raise UsageError(f"{path}: region {region} is outside the {h}x{w} image")
    if _kind(path) == "tiff":
        return _tiff_region(path, r0, r1, c0, c1, level)
    return _png_region(path, r0, r1, c0, c1)


class TileImageFolder(torch.utils.data.Dataset):
    """The images of a folder (or a list of files), as this rank's tile only.

    ``grid`` and ``tile`` (my tile index, the rank in the spatial group) choose the region;
    every image must have the same size. Items are ``(float tensor (C, h, w) scaled by
    ``scale``, label)``, the label from ``labels`` (a dict file name -> int; default 0).
    """

    def __init__(self, root, grid: TileGrid, tile: int, *, labels: dict | None = None,
                 scale: float = 1.0 / 255.0, dtype=torch.float32):
        files = root if isinstance(root, (list, tuple)) else sorted(Path(root).iterdir())
        self.files = [Path(p) for p in files
                      if Path(p).name.lower().endswith(TIFF_SUFFIXES + PNG_SUFFIXES)]
        if not self.files:
            raise UsageError(f"no TIFF or PNG images in {root}")
        self.size = image_size(self.files[0])
        self.region = grid.region(tile, self.size[0], self.size[1])
        self.labels, self.scale, self.dtype = labels or {}, scale, dtype

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int):
        path = self.files[i]
        size = image_size(path)
        if size != self.size:
            raise FormatError(f"{path}: {size[0]}x{size[1]}x{size[2]} differs from the first "
                              f"image's {self.size}; spatial tiles need one image size")
        pixels = read_region(path, self.region)
        x = torch.from_numpy(pixels.astype(np.float32)).to(self.dtype) * self.scale
        return x, self.labels.get(path.name, 0)
