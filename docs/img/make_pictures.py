"""Regenerate the example pictures of docs/pictures.md (needs torch; takes a minute or two).

    .venv/bin/python docs/img/make_pictures.py [name ...]

Graphs are captured from the zoo and profiled on this machine's CPU (one thread, batch 2);
the timelines are hand-made or simulated. PNGs are palette-quantised to stay small.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))


def graph(model: str, profiled: bool = True):
    import torch

    from outcore.cost.profile import profile
    from outcore.graph.capture import capture
    from outcore.zoo import resolve_model

    torch.set_num_threads(1)
    torch.manual_seed(0)
    spec = resolve_model(model, batch_size=2)
    net = spec.build()
    g = capture(net, spec.example_inputs)
    return profile(g, net, spec.example_inputs, device="cpu", warmup=1, repeat=3) \
        if profiled else g


def small_png(path: Path, colours: int = 96) -> None:
    """Quantise a PNG to a palette (labels stay sharp, the file shrinks 3-4x)."""
    from PIL import Image

    im = Image.open(path).convert("RGB")
    im.quantize(colors=colours, method=Image.Quantize.MEDIANCUT).save(path, optimize=True)
    print(f"{path.name}: {im.size[0]}x{im.size[1]} px, {path.stat().st_size // 1024} KiB")


def stages(g, k: int) -> np.ndarray:
    """Contiguous stages of equal layer count in topological (index) order (not of equal
    compute: the cut points then do not move with profiling noise)."""
    return (np.arange(g.num_nodes) * k) // g.num_nodes


def main(which: list[str]) -> None:
    from outcore.graph import collapse
    from outcore.viz import draw_comparison, draw_graph, draw_timeline

    def want(name: str) -> bool:
        return not which or name in which

    def out(name: str) -> Path:
        return HERE / f"{name}.png"

    if want("resnet50_depth1") or want("resnet50_stages"):
        g = graph("torchvision:resnet50")
        if want("resnet50_depth1"):
            draw_graph(collapse(g, 1), out("resnet50_depth1"), title="resnet50, module depth 1",
                       dpi=100)
            small_png(out("resnet50_depth1"))
        if want("resnet50_stages"):
            draw_graph(g, out("resnet50_stages"), assignment=stages(g, 4), max_nodes=30,
                       title="resnet50 in 4 stages of 44-45 layers", dpi=100)
            small_png(out("resnet50_stages"))
    if want("transformer") or want("transformer_depth2"):
        g = graph("outcore:transformer")
        if want("transformer"):
            draw_graph(g, out("transformer"), title="zoo transformer, every layer", dpi=90)
            small_png(out("transformer"))
        if want("transformer_depth2"):
            draw_graph(collapse(g, 2), out("transformer_depth2"),
                       title="zoo transformer, module depth 2", dpi=100)
            small_png(out("transformer_depth2"))
    if want("amoebanet_depth2"):
        g = graph("outcore:amoebanet")
        draw_graph(collapse(g, 2), out("amoebanet_depth2"), title="AmoebaNet, module depth 2",
                   dpi=100)
        small_png(out("amoebanet_depth2"))
    if want("lstm_unrolled"):
        g = graph("outcore:lstm_lm:unroll=True")
        draw_graph(g, out("lstm_unrolled"), title="unrolled 2-layer LSTM (16 steps)", dpi=90)
        small_png(out("lstm_unrolled"))
    if want("diamond_2dev"):
        g = graph("outcore:diamond")
        right = {"right_0", "right_1", "add", "join", "tanh_1", "cat", "head", "output"}
        dev = np.array([int(g.name_of(i) in right) for i in range(g.num_nodes)])
        draw_graph(g, out("diamond_2dev"), assignment=dev, title="diamond on 2 devices", dpi=100)
        small_png(out("diamond_2dev"))
    if want("bands"):
        from tests.viz.graphs import synthetic

        g = synthetic(20_000, 40)
        dev = np.minimum((np.arange(g.num_nodes) * 4) // g.num_nodes, 3)
        dev[::9] = (dev[::9] + 1) % 4  # a few strays, as a rough partitioner would leave
        draw_graph(g, out("bands"), assignment=dev, title="20,000-node random DAG on 4 devices",
                   dpi=90)
        small_png(out("bands"))
    if want("timeline_1f1b") or want("comparison"):
        from tests.viz.fake import one_f_one_b

        tl = one_f_one_b(4, 8, source="hand-made")
        if want("timeline_1f1b"):
            draw_timeline(tl, out("timeline_1f1b"), dpi=100)
            small_png(out("timeline_1f1b"))
        if want("comparison"):
            meas = one_f_one_b(4, 8, jitter=0.25, source="measured", seed=1)
            draw_comparison(tl, meas, out("comparison"), dpi=100)
            small_png(out("comparison"))


if __name__ == "__main__":
    main(sys.argv[1:])
