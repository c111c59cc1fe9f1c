"""The graph IR and the algorithms on it (no torch here; capture lives in ``graph.capture``)."""

from outcore.graph.coarsen import collapse
from outcore.graph.io import from_dict, load, save, to_dict
from outcore.graph.ir import FORMAT, Graph, build, validate

__all__ = ["FORMAT", "Graph", "build", "collapse", "from_dict", "load", "save", "to_dict",
           "validate"]
