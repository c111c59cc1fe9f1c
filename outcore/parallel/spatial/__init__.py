"""Spatial parallelism: an image's early layers run on tiles over several ranks, with halo
exchange at every windowed layer, until a join point gathers the tiles (MPI4DL's SP; see
docs/spatial.md). The pure tile geometry and costs live in :mod:`outcore.cost.spatial_geometry`
and :mod:`outcore.cost.spatial` so that planning code can use them without torch.
"""

from outcore.cost.spatial_geometry import TileGrid
from outcore.parallel.spatial.comm import SpatialGroup, gather_tiles, scatter_image
from outcore.parallel.spatial.convert import SpatialModel, spatialize

__all__ = ["TileGrid", "SpatialGroup", "SpatialModel", "spatialize", "gather_tiles",
           "scatter_image"]
