"""Pictures of outcore's artifacts, drawn with matplotlib only (no graphviz, no torch).

- :func:`draw_graph`: a graph, laid out in layers, optionally coloured by device;
- :func:`draw_timeline`: a Gantt chart per rank and memory over time;
- :func:`draw_comparison`: a predicted and a measured timeline on one time axis.
"""

from outcore.viz.gantt import draw_comparison, draw_timeline
from outcore.viz.graph_draw import draw_graph
from outcore.viz.layout import Layout, layered_layout

__all__ = ["Layout", "draw_comparison", "draw_graph", "draw_timeline", "layered_layout"]
