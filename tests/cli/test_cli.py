"""The outcore command: every subcommand explains itself, bad input is one line and exit 2,
and the artifacts of one command feed the next."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

OUTCORE = [sys.executable, "-m", "outcore.cli.main"]


def run(*args, cwd=None, timeout=300):
    return subprocess.run(OUTCORE + [str(a) for a in args], capture_output=True, text=True,
                          cwd=cwd, timeout=timeout)


@pytest.mark.parametrize("command", ["graph", "profile", "plan", "simulate", "train", "export"])
def test_every_command_has_help(command):
    r = run(command, "--help")
    assert r.returncode == 0
    assert "usage: outcore " + command in r.stdout and len(r.stdout) > 400


def run_here(capsys, monkeypatch, cwd, *args):
    """``outcore ARGS`` in this process (no interpreter and torch import to wait for):
    ``(exit code, stderr)``. The subprocess tests keep the real command's streams covered."""
    from outcore.cli.main import main
    monkeypatch.chdir(cwd)
    try:
        code = main([str(a) for a in args])
    except SystemExit as e:  # argparse's own refusals
        code = e.code
    return code, capsys.readouterr().err


# as_command: run as the command itself (the others in this process, through main())
@pytest.mark.parametrize("args,message,as_command", [
    (["graph", "torchvision:resnet5"], "did you mean torchvision:resnet50", True),
    (["graph", "outcore:nosuch"], "the zoo has", False),
    (["graph", "nothing:here"], "name it torchvision:<builder>", False),
    (["graph", "missing.py:make"], "does not exist", False),
    (["graph", "torchvision:resnet18", "--input-shape", "2x3"], "check --input-shape", False),
    (["graph", "torchvision:resnet18", "--input-shape", "2xq"], "8x3x224x224", False),
    (["graph", "outcore:mlp", "-o", "g.txt"], "must end in .json, .svg, .png", False),
    (["plan", "missing.json", "--devices", "2"], "does not exist", False),
    (["plan", "outcore:mlp", "--devices", "2", "--memory", "lots"], "16GiB", False),
    (["plan", "outcore:mlp", "--devices", "2", "--memory", "1KiB"], "no number of devices fits",
     True),
    (["plan", "outcore:mlp", "--devices", "3", "--dp", "2"], "must divide", False),
])
def test_bad_input_is_one_line_and_exit_2(tmp_path, capsys, monkeypatch, args, message,
                                          as_command):
    if as_command:
        r = run(*args, cwd=tmp_path)
        code, err = r.returncode, r.stderr
    else:
        code, err = run_here(capsys, monkeypatch, tmp_path, *args)
    assert code == 2, err
    lines = [x for x in err.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and "Traceback" not in err, err
    assert message in lines[0], lines[0]


def test_file_function_model_and_debug_traceback(tmp_path, capsys, monkeypatch):
    (tmp_path / "m.py").write_text(
        "import torch\n"
        "def make():\n    return torch.nn.Linear(4, 2), torch.randn(3, 4)\n"
        "def broken():\n    raise RuntimeError('boom')\n")
    r = run("graph", "m.py:make", "-o", "g.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "g.json").read_text())["format"] == "outcore-graph/1"
    code, err = run_here(capsys, monkeypatch, tmp_path, "graph", "m.py:nothing")
    assert code == 2 and "it defines: make, broken" in err
    code, err = run_here(capsys, monkeypatch, tmp_path, "graph", "m.py:broken")
    assert code == 2 and "boom" in err and "Traceback" not in err
    r = run("--debug", "graph", "m.py:broken", cwd=tmp_path)
    assert r.returncode != 0 and "Traceback" in r.stderr


def test_graph_plan_simulate_pipeline(tmp_path):
    r = run("graph", "outcore:diamond", "--costs", "estimate:cpu", "-o", "g.json", "-o", "g.png",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "g.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    r = run("plan", "g.json", "--devices", "2", "--memory", "1MiB", "--microbatches", "2",
            "--strategy", "pipeline", "-o", "p.json", "--gantt", "t.png", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert "predicted iteration" in r.stdout and "peak memory" in r.stdout
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["format"] == "outcore-plan/2" and plan["devices"] == 2
    assert set(plan["assignment"].values()) <= {0, 1}
    r = run("simulate", "p.json", "--graph", "g.json", "--json", "--trace", "trace.json",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    result = json.loads(r.stdout)
    assert result["iteration_s"] > 0 and len(result["peak_bytes"]) == 2
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert any(e.get("ph") == "X" for e in trace["traceEvents"])
    r = run("simulate", "p.json", "--graph", "g.json", "--microbatches", "4", "--schedule",
            "gpipe", cwd=tmp_path)
    assert r.returncode == 0 and "gpipe, 4 micro-batches" in r.stdout
    # the same plan held to a limit it cannot keep: everything printed, then exit 1
    plan["memory_bytes"] = 1000
    (tmp_path / "tight.json").write_text(json.dumps(plan))
    for extra in ([], ["--json"]):
        r = run("simulate", "tight.json", "--graph", "g.json", *extra, cwd=tmp_path)
        assert r.returncode == 1, r.stderr
        assert "does not fit its 1000 B per device" in r.stderr and "device 0" in r.stderr
        assert ("fits memory: NO" in r.stdout) if not extra else not json.loads(r.stdout)["fits"]


def test_plan_splits_the_global_batch_into_the_micro_batches_asked_for(tmp_path):
    """--batch-size is the global batch in plan as in train: with 2 micro-batches on 2
    copies each micro-batch is a quarter of it, and the plan's step trains the 8 samples."""
    r = run("plan", "outcore:mlp", "--devices", "2", "--dp", "2", "--microbatches", "2",
            "--batch-size", "8", "--costs", "estimate:cpu", "-o", "p.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "p.json").read_text())
    graph = json.loads((tmp_path / "p.graph.json").read_text())
    assert plan["graph"]["batch_size"] == 2 and graph["batch_size"] == 2
    samples = plan["predicted"]["samples_per_s"] * plan["predicted"]["iteration_s"]
    assert abs(samples - 8) < 1e-6, samples
    r = run("plan", "outcore:mlp", "--devices", "2", "--microbatches", "3", "--batch-size", "8",
            "--costs", "estimate:cpu", "-o", "q.json", cwd=tmp_path)
    assert r.returncode == 2 and "cannot be split into 3" in r.stderr


def test_a_searched_plan_simulates_on_the_graph_it_was_planned_from(tmp_path):
    """--layout auto splits the graph's batch; simulate takes the same input graph and
    rescales it to the plan's micro-batch (no rescaled copy is written beside the plan); a
    graph --depth collapsed is written beside the plan."""
    import outcore
    from outcore.graph.generators import make

    g = make("unet", 600)
    outcore.save_graph(g, tmp_path / "g.json")
    r = run("plan", "g.json", "--devices", "4", "--layout", "auto", "-o", "p.json",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    plan = json.loads((tmp_path / "p.json").read_text())
    assert plan["graph"]["batch_size"] < g.batch_size  # the search split the batch
    assert not (tmp_path / "p.graph.json").exists()
    r = run("simulate", "p.json", "--graph", "g.json", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)["iteration_s"]
    want = plan["predicted"]["iteration_s"]
    assert abs(got - want) <= 1e-6 * want, (got, want)
    # a graph collapsed by the command exists nowhere else: it is written beside the plan
    outcore.save_graph(outcore.model_graph("outcore:mlp", costs="estimate:cpu"),
                       tmp_path / "m.json")
    r = run("plan", "m.json", "--devices", "2", "--depth", "1", "-o", "q.json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    r = run("simulate", "q.json", "--graph", "q.graph.json", "--json", cwd=tmp_path)
    assert r.returncode == 0, r.stderr


def test_plan_of_a_foreign_graph_file(tmp_path):
    """outcore plan accepts any outcore-graph/1 file, with only the required fields."""
    doc = {"format": "outcore-graph/1", "name": "foreign",
           "nodes": [{"id": i * 7, "fwd_s": 0.001 * (i + 1)} for i in range(6)],
           "edges": [{"src": i * 7, "dst": (i + 1) * 7, "bytes": 1000} for i in range(5)]}
    (tmp_path / "f.json").write_text(json.dumps(doc))
    r = run("plan", "f.json", "--devices", "2", "--strategy", "pardnn", "-o", "p.json",
            cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    assert set(json.loads((tmp_path / "p.json").read_text())["assignment"]) == \
        {str(i * 7) for i in range(6)}


@pytest.mark.dist
@pytest.mark.timeout(400)
def test_train_out_of_core_on_one_device(tmp_path):
    """A model whose plain training step needs more than --memory trains on one device by
    checkpointing; the measured peak stays under the limit."""
    r = run("train", "outcore:resnet_k:depth=29,width=8", "--devices", "1", "--memory", "30MB",
            "--batch-size", "16", "--steps", "2", "--costs", "estimate:cpu",
            "--microbatches", "1", "--run-dir", "run", cwd=tmp_path, timeout=400)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    assert report["peak_bytes"][0] <= 30e6
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert {g["policy"] for g in plan["memory_policy"]["groups"]} == {"checkpoint"}
    assert "checkpoint on" in r.stdout
    # not a terminal: progress is one line per phase and per step (readable in a log file)
    for line in ("capturing the graph ...", "planning ...", "step 1/2  loss", "step 2/2  loss"):
        assert line in r.stdout, r.stdout
    r = run("train", "outcore:resnet_k:depth=29,width=8", "--devices", "1", "--memory", "30MB",
            "--batch-size", "16", "--steps", "1", "--memory-policy", "none",
            "--microbatches", "1", "--costs", "estimate:cpu", cwd=tmp_path)
    assert r.returncode == 2 and "devices" in r.stderr


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_train_starts_only_the_workers_the_plan_uses(tmp_path):
    """--devices 4 on a model too small to split: the plan uses fewer devices, the run says
    so and starts only those workers (the report and the plan agree)."""
    r = run("train", "outcore:mlp", "--devices", "4", "--steps", "1", "--costs", "estimate",
            "--run-dir", "run", cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    report = json.loads((tmp_path / "run" / "report.json").read_text())
    plan = json.loads((tmp_path / "run" / "plan.json").read_text())
    assert report["devices"] == plan["devices"] < 4
    assert len(report["busy_s"]) == plan["devices"]
    assert f"the plan uses {plan['devices']} of 4 devices" in r.stdout
    assert any("starting" in n for n in plan["notes"])


def test_model_names_are_printed_as_written(tmp_path):
    """rich reads ``:llama:`` as an emoji code; a model name is text."""
    p = run("graph", "hf:llama:num_hidden_layers=1", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    assert "hf:llama:num_hidden_layers=1" in p.stdout, p.stdout
