"""Tensor (intra-layer) parallelism: Megatron pairs found from the graph, split with
``torch.distributed.tensor``; FSDP-style depth sharding; AxoNN's ``auto_parallelize``.

See docs/tensor.md. The pure layout (which layer is split how) is
:func:`outcore.graph.tensor_pairs.find_layout`; its costs are in :mod:`outcore.cost.tensor`.
"""

from outcore.graph.tensor_pairs import Pair, Split, TensorLayout, find_layout
from outcore.parallel.tensor.auto import auto_parallelize
from outcore.parallel.tensor.parallel import (
                                     MODES,
                                     depth_units,
                                     grid_mesh,
                                     layout_of,
                                     tensor_mesh,
                                     tensor_parallel,
)

__all__ = ["MODES", "Pair", "Split", "TensorLayout", "auto_parallelize", "depth_units",
           "find_layout", "grid_mesh", "layout_of", "tensor_mesh", "tensor_parallel"]
