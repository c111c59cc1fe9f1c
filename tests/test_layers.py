"""Layers import only downward (DESIGN.md), and planning and simulation never import torch.

An AST check over every module: each package has a layer number; a module may import outcore
modules of its own layer or below, and the torch-free layers may not import torch at all.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "outcore"

# package (or module) -> layer; DESIGN.md's table (runtime is 4', beside the simulator)
LAYERS = {
    "errors": 0, "units": 0,
    "graph": 1, "graph.capture": 1, "hardware": 1, "zoo": 1,
    "cost": 2,
    "plan": 3, "schedule": 3,
    "sim": 4, "runtime": 4, "viz": 4,
    "partition": 5,
    "api": 6, "train_api": 6, "__init__": 6,
    "cli": 7,
}
TORCH_FREE = ("errors", "units", "graph", "hardware.spec", "hardware.presets", "cost.memory",
              "cost.analytical", "cost.regression", "plan", "schedule", "sim", "partition",
              "viz")
TORCH_ALLOWED = ("graph.capture", "graph.export_trace")  # capture by torch.fx, torch.export


def module_name(path: Path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = [p for p in rel.parts if p != "__init__"] or ["__init__"]
    return ".".join(parts)


def layer_of(name: str) -> int:
    parts = name.split(".")
    for k in range(len(parts), 0, -1):
        key = ".".join(parts[:k])
        if key in LAYERS:
            return LAYERS[key]
    raise AssertionError(f"module outcore.{name} has no layer in tests/test_layers.py")


def imports(path: Path) -> list[str]:
    tree = ast.parse(path.read_text())
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append(node.module)
    return out


def test_layers_import_only_downward_and_planning_is_torch_free():
    problems = []
    for path in sorted(ROOT.rglob("*.py")):
        name = module_name(path)
        mine = layer_of(name)
        for imp in imports(path):
            if imp == "torch" or imp.startswith("torch.") or imp.startswith("torchvision"):
                torch_free = any(name == t or name.startswith(t + ".") for t in TORCH_FREE)
                allowed = any(name == t for t in TORCH_ALLOWED)
                if torch_free and not allowed:
                    problems.append(f"outcore.{name} imports {imp} (a torch-free layer)")
            elif imp.startswith("outcore.") or imp == "outcore":
                target = imp[len("outcore."):] if imp != "outcore" else "__init__"
                if target and layer_of(target) > mine:
                    problems.append(f"outcore.{name} (layer {mine}) imports outcore.{target} "
                                    f"(layer {layer_of(target)})")
    assert not problems, "\n".join(problems)
