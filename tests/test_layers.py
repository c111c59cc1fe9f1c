"""Layers import only downward (DESIGN.md), and planning and simulation never import torch.

An AST check over every module: each package has a layer number; a module may import outcore
modules of its own layer or below, and the torch-free layers may not import torch at all.
Beyond the layer numbers, the design's stricter rules: planning, scheduling and simulation never
import the runtime; the runtime never imports the planners, the simulator or the cost-model
fitting; the CLI imports only the public API (``outcore``, ``outcore.api``), ``units`` and
``errors``.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "outcore"

# package (or module) -> layer; DESIGN.md's table (runtime is 4', beside the simulator)
LAYERS = {
    "errors": 0, "units": 0, "jsonfile": 0, "lazytuple": 0, "config": 0,
    "graph": 1, "graph.capture": 1, "hardware": 1, "zoo": 1,
    "cost": 2,
    "plan": 3, "schedule": 3, "trace": 3,
    "sim": 4, "viz": 4, "core": 4,
    "parallel": 5, "runtime": 6,
    "placers": 5,
    "search": 6,
    "api": 7, "job": 7, "report": 7, "__init__": 7,
    "cli": 8,
}
TORCH_FREE = ("errors", "units", "jsonfile", "lazytuple", "config", "graph", "hardware.spec",
              "hardware.presets", "hardware.cluster", "hardware.collectives", "cost.memory",
              "cost.analytical",
              "cost.regression", "cost.tensor", "cost.grid", "cost.spatial",
              "cost.spatial_geometry", "graph.tensor_pairs",
              "plan",
              "schedule", "trace", "sim", "placers", "search", "viz")
TORCH_ALLOWED = ("graph.capture",)
# importer -> outcore packages it must never import, whatever their layer
FORBIDDEN = {
    "plan": ("runtime", "sim", "placers", "search"),
    "schedule": ("runtime", "sim", "placers", "search"),
    "trace": ("runtime", "sim", "placers", "search", "schedule"),
    "sim": ("runtime", "placers", "search"),
    "placers": ("runtime", "search", "sim"),
    "search": ("runtime",),
    "core": ("parallel", "runtime", "placers", "search", "sim", "cost.regression",
             "cost.calibrate", "api", "job"),
    "parallel": ("runtime", "placers", "search", "sim", "cost.regression", "cost.calibrate",
                 "api", "job"),
    "runtime": ("placers", "search", "sim", "cost.regression", "cost.calibrate", "api", "job"),
}
CLI_MAY_IMPORT = ("__init__", "api", "config", "units", "errors", "cli")


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


def within(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def rule_problems(name: str, target: str) -> list[str]:
    """The design rules beyond layer numbers that ``outcore.name`` importing ``target`` breaks."""
    out = []
    for importer, banned in FORBIDDEN.items():
        if within(name, importer):
            out += [f"outcore.{name} imports outcore.{target} ({importer} never imports {b})"
                    for b in banned if within(target, b)]
    if within(name, "cli") and not any(within(target, ok) for ok in CLI_MAY_IMPORT):
        out.append(f"outcore.{name} imports outcore.{target} (the CLI imports only the public "
                   "API, units and errors)")
    return out


def test_layers_import_only_downward_and_planning_is_torch_free():
    problems = []
    for path in sorted(ROOT.rglob("*.py")):
        name = module_name(path)
        mine = layer_of(name)
        for imp in imports(path):
            if imp == "torch" or imp.startswith("torch.") or imp.startswith("torchvision"):
                torch_free = any(name == t or name.startswith(t + ".") for t in TORCH_FREE)
                allowed = any(within(name, t) for t in TORCH_ALLOWED)
                if torch_free and not allowed:
                    problems.append(f"outcore.{name} imports {imp} (a torch-free layer)")
            elif imp.startswith("outcore.") or imp == "outcore":
                target = imp[len("outcore."):] if imp != "outcore" else "__init__"
                if target and layer_of(target) > mine:
                    problems.append(f"outcore.{name} (layer {mine}) imports outcore.{target} "
                                    f"(layer {layer_of(target)})")
                problems += rule_problems(name, target)
    assert not problems, "\n".join(problems)


def test_the_rules_catch_each_violation_the_design_forbids():
    """Each import the design forbids (and that earlier code had) is reported."""
    for name, target in [("runtime.executor", "sim.timeline"), ("runtime.trainer", "sim.simulate"),
                         ("runtime.worker", "search.loop"), ("cli.plan_cmd", "placers"),
                         ("cli.train_cmd", "runtime.env"), ("cli.graph_cmd", "zoo"),
                         ("schedule.lower", "sim.engine"), ("search.loop", "runtime"),
                         ("placers.run", "sim.simulate"), ("placers.pardnn", "search.loop"),
                         ("runtime.data", "cost.regression")]:
        assert rule_problems(name, target), f"outcore.{name} -> outcore.{target} not caught"
    for name, target in [("cli.plan_cmd", "__init__"), ("cli.main", "errors"),
                         ("runtime.trainer", "schedule.lower"), ("sim.simulate", "trace"),
                         ("search.loop", "sim.simulate")]:
        assert not rule_problems(name, target), f"outcore.{name} -> outcore.{target} allowed"
