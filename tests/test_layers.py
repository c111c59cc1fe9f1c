"""The package's layers (docs/design.md, "Layers"): imports point down only, planning and
simulation never import torch, no module imports another's private names, and there is no import
circle between modules nor between packages.

An AST check over every module (imports inside functions count; those under ``if
TYPE_CHECKING:`` do not): each package has a layer number; a module may import outcore modules
of its own layer or below, and the torch-free layers may not import torch at all. Beyond the
numbers, the design's stricter rules: the planning side (plan, schedule, trace, sim, placers,
search) never imports the runtime side (core, parallel, runtime) nor the other way round; the
core knows no parallelism; the CLI imports only the public API (which hands it the
configuration's options), units and errors.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "outcore"

# package (or module) -> layer
LAYERS = {
    "errors": 0, "units": 0, "jsonfile": 0, "lazytuple": 0, "config": 0,
    "graph": 1, "graph.capture": 1, "hardware": 1, "zoo": 1,
    "cost": 2,
    "plan": 3, "schedule": 3, "trace": 3,
    "sim": 4, "viz": 4, "core": 4,
    "placers": 5, "parallel": 5,
    "search": 6, "runtime": 6,
    "api": 7, "job": 7, "report": 7, "__init__": 7,
    "cli": 8,
}
TORCH_FREE = ("errors", "units", "jsonfile", "lazytuple", "config", "graph", "hardware.spec",
              "hardware.presets", "hardware.cluster", "hardware.collectives", "cost.memory",
              "cost.analytical", "cost.regression", "cost.tensor", "cost.grid", "cost.spatial",
              "cost.spatial_geometry", "graph.tensor_pairs", "plan", "schedule", "trace", "sim",
              "placers", "search", "viz")
TORCH_ALLOWED = ("graph.capture",)
PLANNING = ("plan", "schedule", "trace", "sim", "placers", "search")
RUNNING = ("core", "parallel", "runtime")
FITTING = ("cost.regression", "cost.calibrate")
# importer -> outcore packages it must never import, whatever their layer
FORBIDDEN = {
    "plan": RUNNING + ("sim", "placers", "search"),
    "schedule": RUNNING + ("sim", "placers", "search"),
    "trace": RUNNING + ("sim", "placers", "search", "schedule"),
    "sim": RUNNING + ("placers", "search"),
    "placers": RUNNING + ("search", "sim"),
    "search": RUNNING,
    "core": ("parallel", "runtime", "api", "job") + PLANNING[3:] + FITTING,
    "parallel": ("runtime", "api", "job") + PLANNING[3:] + FITTING,
    "runtime": ("api", "job") + PLANNING[3:] + FITTING,
}
CLI_MAY_IMPORT = ("__init__", "api", "units", "errors", "cli")


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


def _type_checking(node: ast.AST) -> bool:
    t = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(t, ast.Name) and t.id == "TYPE_CHECKING")
        or (isinstance(t, ast.Attribute) and t.attr == "TYPE_CHECKING"))


def import_nodes(path: Path) -> list[ast.Import | ast.ImportFrom]:
    """Every import of a module, inside functions too, but not under ``if TYPE_CHECKING:``."""
    tree = ast.parse(path.read_text())
    skip = {id(x) for n in ast.walk(tree) if _type_checking(n) for b in n.body
            for x in ast.walk(b)}
    return [n for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
            and id(n) not in skip]


def imports(path: Path) -> list[str]:
    out = []
    for node in import_nodes(path):
        if isinstance(node, ast.Import):
            out += [a.name for a in node.names]
        elif node.module and node.level == 0:
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
    """Each import the design forbids is reported, and the ones it allows are not."""
    for name, target in [("runtime.trainer", "sim.simulate"), ("runtime.worker", "search.loop"),
                         ("cli.plan_cmd", "placers"), ("cli.train_cmd", "runtime.launch"),
                         ("cli.graph_cmd", "zoo"), ("cli.train_cmd", "config"),
                         ("schedule.lower", "sim.engine"),
                         ("search.loop", "runtime"), ("search.loop", "core.comm"),
                         ("placers.run", "sim.simulate"), ("placers.pardnn", "search.loop"),
                         ("core.executor", "parallel.sharding"), ("core.comm", "runtime.worker"),
                         ("parallel.sharding", "runtime.trainer"), ("runtime.data",
                                                                    "cost.regression")]:
        assert rule_problems(name, target), f"outcore.{name} -> outcore.{target} not caught"
    for name, target in [("cli.plan_cmd", "__init__"), ("cli.main", "errors"),
                         ("cli.train_cmd", "api"), ("runtime.trainer", "schedule.lower"),
                         ("runtime.trainer", "parallel"), ("parallel.sharding", "core.comm"),
                         ("sim.simulate", "trace"), ("search.loop", "sim.simulate"),
                         ("search.loop", "placers")]:
        assert not rule_problems(name, target), f"outcore.{name} -> outcore.{target} allowed"


def _module_of(target: str, modules: set[str]) -> str | None:
    while target and target not in modules:
        target = target.rpartition(".")[0]
    return target or None


def import_graph() -> dict[str, set[str]]:
    """Module -> the outcore modules it imports (``from pkg import mod`` names the module)."""
    paths = {module_name(p): p for p in ROOT.rglob("*.py")}
    modules = set(paths)
    edges: dict[str, set[str]] = defaultdict(set)
    for name, path in paths.items():
        base = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in import_nodes(path):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                mod = node.module or ""
                if node.level:
                    parts = ("outcore." + base).split(".")[:len(base.split(".")) + 2 - node.level]
                    mod = ".".join(parts + ([mod] if mod else []))
                targets = [f"{mod}.{a.name}" if f"{mod}.{a.name}"[len("outcore."):] in modules
                           else mod for a in node.names]
            for t in targets:
                if t == "outcore" or t.startswith("outcore."):
                    m = _module_of(t[len("outcore."):] if t != "outcore" else "__init__",
                                   modules)
                    if m and m != name:
                        edges[name].add(m)
    return edges


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(set(edges) | {w for ws in edges.values() for w in ws}):
        if v not in index:
            visit(v)
    return out


def test_no_import_circle_between_modules_or_packages():
    edges = import_graph()
    assert not circles(edges), circles(edges)
    packages: dict[str, set[str]] = defaultdict(set)
    for a, targets in edges.items():
        for b in targets:
            if a.split(".")[0] != b.split(".")[0]:
                packages[a.split(".")[0]].add(b.split(".")[0])
    assert not circles(packages), circles(packages)


def test_the_circle_check_finds_a_circle():
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert circles({"a": {"b"}, "b": set()}) == []


def test_no_module_imports_another_modules_private_names():
    """``from outcore.x import _name`` reaches into another module; a private module of the
    importer's own package (``from outcore.sim import _engine_kernel``) is the package's own."""
    problems = []
    modules = {module_name(p) for p in ROOT.rglob("*.py")}
    for path in sorted(ROOT.rglob("*.py")):
        name = module_name(path)
        for node in import_nodes(path):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                    "outcore"):
                continue
            for alias in node.names:
                if not alias.name.startswith("_") or alias.name.startswith("__"):
                    continue
                whole = f"{node.module}.{alias.name}"[len("outcore."):]
                same_package = whole in modules and \
                    whole.rpartition(".")[0] == name.rpartition(".")[0]
                if not same_package:
                    problems.append(f"outcore.{name} imports {alias.name} from {node.module}")
    assert not problems, "\n".join(problems)
