"""``--task`` and ``--leaf``: the targets a run trains on, and modules kept as one layer.

``--leaf`` takes a module class name (every module of that type) or a module path, on
``outcore graph``, ``plan`` and ``train`` (where the workers capture the same leaves).
``--task regression`` on ``train`` makes the targets real numbers and the loss MSE: the first
step's loss is checked against plain PyTorch on the same seeded batch.
"""

from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from outcore.core.values import value_metas
from outcore.graph.capture import trace
from outcore.runtime.data import SyntheticData, split
from outcore.zoo import build_model
from tests.cli.test_cli import run, run_here

MODEL_FILE = '''import torch
from torch import nn
class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.a = nn.Linear(d, d)
        self.b = nn.Linear(d, d)
    def forward(self, x):
        return x + self.b(torch.tanh(self.a(x)))
class Net(nn.Module):
    def __init__(self, d=8):
        super().__init__()
        self.blocks = nn.Sequential(Block(d), Block(d), Block(d))
        self.head = nn.Linear(d, 3)
    def forward(self, x):
        return self.head(self.blocks(x))
def make():
    return Net(), torch.randn(4, 8)
'''


@pytest.fixture
def model(tmp_path):
    (tmp_path / "m.py").write_text(MODEL_FILE)
    return str(tmp_path / "m.py") + ":make"


def _modules(path) -> list[str]:
    return [n.get("module", "") for n in json.loads(path.read_text())["nodes"]]


# graph and plan run in this process (tests.cli.test_cli.run_here); train as the command
def test_graph_leaf_by_class_and_by_path(tmp_path, model, capsys, monkeypatch):
    code, err = run_here(capsys, monkeypatch, tmp_path, "graph", model, "--leaf", "Block", "-o",
                         "byclass.json")
    assert code == 0, err
    mods = _modules(tmp_path / "byclass.json")
    assert {"blocks.0", "blocks.1", "blocks.2"} <= set(mods)
    assert not any(m.startswith("blocks.0.") for m in mods), mods
    code, err = run_here(capsys, monkeypatch, tmp_path, "graph", model, "--leaf", "blocks.1",
                         "-o", "bypath.json")
    assert code == 0, err
    mods = _modules(tmp_path / "bypath.json")
    assert "blocks.1" in mods and "blocks.0.a" in mods and "blocks.2.b" in mods


def test_unknown_leaf_is_one_line_naming_close_types(tmp_path, model, capsys, monkeypatch):
    code, err = run_here(capsys, monkeypatch, tmp_path, "graph", model, "--leaf", "Blok")
    assert code == 2 and "Traceback" not in err
    assert "neither a module path nor a module class" in err and "Block" in err


def test_plan_with_leaf_plans_the_coarser_graph(tmp_path, model, capsys, monkeypatch):
    code, err = run_here(capsys, monkeypatch, tmp_path, "plan", model, "--devices", "2",
                         "--leaf", "Block", "-o", "p.json")
    assert code == 0, err
    assignment = json.loads((tmp_path / "p.json").read_text())["assignment"]
    assert len(assignment) == 6  # input, 3 blocks, head, output


def test_train_task_regression_with_leaf_on_two_workers(tmp_path, model):
    r = run("train", model, "--devices", "2", "--steps", "1", "--batch-size", "8",
            "--microbatches", "2", "--task", "regression", "--leaf", "Block",
            "--run-dir", "run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    mods = _modules(tmp_path / "run" / "graph.json")
    assert "blocks.0" in mods and not any(m.startswith("blocks.0.") for m in mods)
    loss = json.loads((tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[0])["loss"]
    # plain PyTorch: same seed, same batch, MSE against real-valued targets
    spec, net = build_model(model, batch_size=8, seed=0)
    gm = trace(net).gm
    out = next(n.name for n in gm.graph.nodes if n.op == "output")
    meta = value_metas(gm, split(spec.example_inputs, 2)[0])[out]
    x, y = SyntheticData(spec.example_inputs, spec.int_high, meta, 8, 0, "regression").batch(0)
    assert y.is_floating_point()
    with torch.no_grad():
        want = sum(F.mse_loss(net(*xs), ys).item() / 2 for xs, ys in zip(split(x, 2),
                                                                          split(y, 2)))
    assert loss == pytest.approx(want, rel=1e-5)


def test_task_and_leaf_have_help():
    r = run("train", "--help")
    assert "--task" in r.stdout and "causal_lm" in r.stdout and "--leaf" in r.stdout
    for command in ("graph", "plan"):
        assert "module class name" in " ".join(run(command, "--help").stdout.split())
