"""``--data tiles:FOLDER``: training batches of huge images where each rank reads only its tile.

A folder of same-size TIFF or PNG images (``outcore.parallel.spatial.images``; labels from an
optional ``labels.json``, file name -> class index, default 0), shuffled with a seeded permutation
per epoch like ``imagefolder:``. Under a spatial plan every rank of the tile group reads only its
tile's region of each image (tiled TIFF: only the overlapping tiles are decoded); a rank that needs
only the targets reads no pixels; without spatial parallelism the rank holding the model's input
reads whole images. Pixels are scaled to [0, 1], not resized.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

from outcore.cost.spatial_geometry import TileGrid
from outcore.errors import UsageError
from outcore.parallel.spatial.images import TileImageFolder

__all__ = ["TileCut", "TileFolderData"]


class TileCut:
    """Another data source (synthetic, ``imagefolder:``) under a spatial plan: each batch's
    images that the tiled layers read are cut to this rank's tile and copied, so the whole
    image is dropped before the step, and a rank of the tile group holds only its tile during
    it (what the memory model counts). The whole image still exists while the source makes the
    batch: use ``tiles:`` to never hold it.

    Args:
        data: the source (``batch(step) -> (inputs, targets)``).
        cut: input position -> the image's (H, W).
        grid, tile: this rank's tile.
    """

    def __init__(self, data: Any, cut: dict[int, tuple[int, int]], grid: TileGrid, tile: int):
        self.data, self.cut, self.grid, self.tile = data, cut, grid, tile
        self.batch_size = data.batch_size

    @staticmethod
    def for_trainer(data: Any, trainer: Any) -> Any:
        """``data`` cut for this rank of a spatial plan (``data`` itself outside one)."""
        sp = getattr(trainer, "spatial", None)
        if sp is None or not sp.images:
            return data
        cut = {k: sp.images[name] for k, name in enumerate(trainer.placeholders)
               if name in sp.images}
        return TileCut(data, cut, sp.sg.grid, sp.sg.tile)

    def batch(self, step: int):
        inputs, targets = self.data.batch(step)
        out = list(inputs)
        for k, hw in self.cut.items():
            if k < len(out) and tuple(out[k].shape[-2:]) == hw:
                r0, r1, c0, c1 = self.grid.region(self.tile, *hw)
                out[k] = out[k][..., r0:r1, c0:c1].clone(
                    memory_format=torch.contiguous_format)
        return tuple(out), targets


class TileFolderData:
    """Batches ``((images or tiles,), labels)`` of a folder (see the module docstring).

    Args:
        root: the folder.
        batch_size: images per step.
        seed: shuffling seed.
        grid, tile: this rank's tile (None: whole images).
        read_pixels: False for a rank that needs only the labels.
    """

    def __init__(self, root: str, batch_size: int, seed: int, *, grid: TileGrid | None = None,
                 tile: int = 0, read_pixels: bool = True):
        labels_file = Path(root) / "labels.json"
        labels = json.loads(labels_file.read_text()) if labels_file.exists() else {}
        self.ds = TileImageFolder(root, grid or TileGrid(rows=1, cols=1), tile, labels=labels)
        if len(self.ds) < batch_size:
            raise UsageError(f"image folder {root!r} has {len(self.ds)} images, fewer than the "
                             f"batch size {batch_size}")
        self.batch_size, self.seed, self.read_pixels = batch_size, seed, read_pixels
        self.per_epoch = len(self.ds) // batch_size

    @staticmethod
    def for_trainer(root: str, trainer: Any, batch_size: int, seed: int) -> "TileFolderData":
        """This rank's reader: its tile under a spatial plan, else whole images."""
        sp = getattr(trainer, "spatial", None)
        return TileFolderData(root, batch_size, seed, grid=sp.sg.grid if sp else None,
                              tile=sp.sg.tile if sp else 0, read_pixels=trainer.needs_inputs)

    def batch(self, step: int):
        epoch, k = divmod(step, self.per_epoch)
        perm = torch.randperm(len(self.ds), generator=torch.Generator().manual_seed(
            self.seed * 7919 + epoch))
        idx = perm[k * self.batch_size:(k + 1) * self.batch_size].tolist()
        labels = torch.tensor([self.ds.labels.get(self.ds.files[i].name, 0) for i in idx])
        if not self.read_pixels:
            return (torch.empty(len(idx), 0),), labels
        return (torch.stack([self.ds[i][0] for i in idx]),), labels
