"""NaN and inf are never silent: the run stops at the first non-finite loss or gradient with one
line naming the step and the last good checkpoint (or skips that step's update when asked), and
the metrics file stays strict JSON.

SGD with lr 1e38 on the MLP: step 0 and 1 are finite (single-process training gives losses
2.38 and 4.0e37), the update after step 1 overflows float32, so step 2 is NaN."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from outcore.config import TrainConfig
from outcore.errors import NonFiniteError
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from tests.runtime.helpers import chunks, docs_for, reference

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]

BASE = dict(model="outcore:mlp", batch_size=8, microbatches=2, steps=5, optimizer="sgd",
            lr=1e38, track_memory=False)


def _strict(line: str) -> dict:
    def refuse(name: str):
        raise ValueError(f"bare {name} in a metrics line: not JSON")
    return json.loads(line, parse_constant=refuse)


def _run(cfg: TrainConfig):
    graph_doc, plan_doc, _ = docs_for(cfg, lambda g: chunks(g, 2), 2)
    return run_local(train_worker, 2, (cfg, graph_doc, plan_doc), timeout_s=60)


def test_the_premise_step_2_is_the_first_nan():
    losses = reference(TrainConfig.make(**{**BASE, "steps": 3}))[0]
    assert math.isfinite(losses[0]) and math.isfinite(losses[1]) and math.isnan(losses[2])


def test_stops_at_the_first_nonfinite_step(tmp_path):
    metrics, ckpt = tmp_path / "m.jsonl", tmp_path / "ckpt"
    cfg = TrainConfig.make(**BASE, metrics_out=str(metrics), checkpoint_dir=str(ckpt),
                           checkpoint_every=1)
    with pytest.raises(NonFiniteError) as err:
        _run(cfg)
    msg = str(err.value)
    assert "step 2: non-finite loss" in msg and "\n" not in msg, msg
    assert f"last good checkpoint is {ckpt / 'step_2'}" in msg, msg
    lines = [_strict(x) for x in metrics.read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2]
    assert lines[2]["loss"] is None and "loss" in lines[2]["nonfinite"]
    assert not (ckpt / "step_3").exists()


def test_skip_leaves_the_parameters_finite(tmp_path):
    metrics = tmp_path / "m.jsonl"
    cfg = TrainConfig.make(**BASE, metrics_out=str(metrics), on_nonfinite="skip", return_state=True)
    results = _run(cfg)
    lines = [_strict(x) for x in metrics.read_text().splitlines()]
    assert [m["step"] for m in lines] == [0, 1, 2, 3, 4]
    assert not lines[1].get("skipped") and lines[2]["skipped"] and lines[2]["loss"] is None
    for r in results:  # the NaN update never reached the parameters
        for k, v in r["state"].items():
            assert bool(v.isfinite().all()), k


@pytest.mark.slow
def test_the_cli_exits_non_zero_with_one_line(tmp_path):
    env = dict(os.environ, PYTHONPATH=os.getcwd())
    r = subprocess.run([sys.executable, "-m", "outcore.cli.main", "train", "outcore:mlp",
                        "--devices", "2", "--steps", "5", "--optimizer", "sgd", "--lr", "1e38",
                        "--costs", "estimate:cpu", "--microbatches", "2", "--run-dir",
                        str(tmp_path / "run")], capture_output=True, text=True, timeout=200,
                       env=env)
    assert r.returncode != 0
    errors = [x for x in r.stderr.splitlines() if "error:" in x]
    assert len(errors) == 1 and "non-finite loss" in errors[0], r.stderr[-2000:]
    assert "Traceback" not in r.stderr
    for line in (tmp_path / "run" / "metrics.jsonl").read_text().splitlines():
        _strict(line)


def test_a_rank_without_work_joins_the_check(tmp_path):
    """A plan may leave a rank idle (no actions, no OPT): it still joins each step's verdict,
    so the guard neither hangs nor lets the other ranks apply a NaN update."""
    cfg = TrainConfig.make(**BASE, on_nonfinite="skip", return_state=True)
    graph_doc, plan_doc, _ = docs_for(cfg, lambda g: chunks(g, 2), 3)
    results = run_local(train_worker, 3, (cfg, graph_doc, plan_doc), timeout_s=30)
    assert results[2]["pieces"] == [] and not results[2]["state"]
    assert math.isnan(results[0]["losses"][2])
    for r in results[:2]:
        assert all(bool(v.isfinite().all()) for v in r["state"].values())
