"""What the simulator predicts is what the runtime runs: ``outcore plan --schedule-out`` then
``outcore simulate`` and ``outcore train --plan --schedule-file`` (real processes, the CLI)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import outcore
from outcore.trace import load_events

pytestmark = [pytest.mark.dist, pytest.mark.timeout(400)]

OUTCORE = [sys.executable, "-m", "outcore.cli.main"]
MODEL = "outcore:transformer:layers=2,d_model=16,heads=2,seq=4,vocab=32"


def run(*args, cwd):
    r = subprocess.run(OUTCORE + [str(a) for a in args], capture_output=True, text=True,
                       cwd=cwd, timeout=300)
    assert r.returncode == 0, r.stderr[-2000:]
    return r


def measured_actions(run_dir: Path, ranks: int) -> list[list[str]]:
    """Each rank's executed actions in order (the runtime traces every action of the last
    step, labelled by its string form)."""
    out = []
    for r in range(ranks):
        tl = load_events(run_dir / "trace" / f"rank{r}.json")
        out.append([e.label for e in sorted(tl.events, key=lambda e: e.start_s)])
    return out


def test_train_runs_the_actions_simulate_predicted(tmp_path):
    run("plan", MODEL, "--devices", "2", "--strategy", "round-robin", "--microbatches", "2",
        "--batch-size", "2", "-o", "p.json", "--schedule-out", "s.json", cwd=tmp_path)
    run("simulate", "p.json", "--graph", "p.graph.json", "--schedule-file", "s.json",
        "--trace", "sim.json", cwd=tmp_path)
    run("train", MODEL, "--devices", "2", "--plan", "p.json", "--schedule-file", "s.json",
        "--batch-size", "4", "--microbatches", "2", "--steps", "2", "--costs", "estimate",
        "--run-dir", "run", cwd=tmp_path)
    g = outcore.load_graph(tmp_path / "p.graph.json")
    p = outcore.load_plan(tmp_path / "p.json", g)
    low = outcore.lower(p, g, schedule_file=tmp_path / "s.json")
    predicted = [[str(a) for a in acts] for acts in low.schedule.actions]
    assert all(len(acts) > 10 for acts in predicted)  # both ranks compute and talk
    assert measured_actions(tmp_path / "run", 2) == predicted
    file_lists = json.loads((tmp_path / "s.json").read_text())["actions"]
    assert [line.split() for line in file_lists] == predicted
    # the simulated timeline runs the same compute in the same order on every rank
    sim = outcore.simulate(p, g, schedule_file=tmp_path / "s.json").timeline
    for r in range(2):
        simulated = [e.label for e in sorted(sim.events, key=lambda e: e.start_s)
                     if e.rank == r and e.kind in ("F", "B")]
        assert simulated == [a for a in predicted[r] if a[-2:-1] in ("F", "B")
                             and not a.startswith("t")]


def test_schedule_file_from_another_plan_is_refused(tmp_path):
    run("plan", MODEL, "--devices", "2", "--strategy", "pipeline", "--microbatches", "2",
        "--batch-size", "2", "-o", "p.json", "--schedule-out", "s.json", cwd=tmp_path)
    run("plan", MODEL, "--devices", "2", "--strategy", "round-robin", "--microbatches", "2",
        "--batch-size", "2", "-o", "q.json", cwd=tmp_path)
    r = subprocess.run(OUTCORE + ["simulate", "q.json", "--graph", "p.graph.json",
                                  "--schedule-file", "s.json"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=120)
    assert r.returncode != 0 and "other pieces" in r.stderr and "Traceback" not in r.stderr
