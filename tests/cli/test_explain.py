"""outcore plan --explain: the search's candidates as a table and a picture; a plan whose
search chose the micro-batches is simulated on the graph written beside it."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import outcore
from outcore.search.explain import rows, runner_up

OUTCORE = [sys.executable, "-m", "outcore.cli.main"]
UNET = f"{Path(__file__).parents[1] / 'search' / 'unet_model.py'}:make"


def test_plan_explain_table_picture_and_rescaled_graph(tmp_path):
    r = subprocess.run(OUTCORE + ["plan", UNET, "--devices", "2", "--layout", "auto",
                                  "--microbatches", "auto", "--explain", "-o", "p.json"],
                       capture_output=True, text=True, cwd=tmp_path, timeout=300,
                       env={"COLUMNS": "200", **__import__("os").environ})
    assert r.returncode == 0, r.stderr
    assert "candidates (best first)" in r.stdout and "chosen" in r.stdout
    assert "slower" in r.stdout
    assert (tmp_path / "p.candidates.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    g = outcore.load_graph(tmp_path / "p.graph.json")
    p = outcore.load_plan(tmp_path / "p.json", g)
    assert g.batch_size == p.graph["batch_size"]
    # the graph beside the plan is the micro-batch the plan was made for
    assert abs(outcore.simulate(p, g).iteration_s - p.predicted["iteration_s"]) \
        <= 1e-9 + 1e-6 * p.predicted["iteration_s"]
    doc = json.loads((tmp_path / "p.json").read_text())
    assert sum(c["outcome"] == "chosen" for c in doc["extra"]["candidates"]) == 1


def test_rows_put_the_chosen_first_and_name_the_runner_up():
    g = outcore.model_graph(UNET, costs="estimate:cpu")
    p = outcore.plan(g, outcore.plan_request(2, None, microbatches="auto",
                                             search_layout=True))
    got = rows(p)
    assert got[0]["chosen"] and got[0]["iteration_s"] == p.predicted["iteration_s"]
    timed = [r for r in got[1:] if r["iteration_s"] is not None]
    assert all(a["iteration_s"] <= b["iteration_s"] for a, b in zip(timed, timed[1:]))
    second = runner_up(p)
    assert second is not None and not second["chosen"] and second["why"] != "chosen"
    # a plan made without the layout search still explains its placements
    plain = outcore.plan(g, outcore.plan_request(2, None))
    own = rows(plain)
    assert own[0]["chosen"] and {r["strategy"] for r in own} >= {"contiguous"}


def test_plan_layout_auto_searches_tp_unless_given(tmp_path):
    """``--layout auto`` alone also searches the tensor-parallel degree (a transformer's
    Linear pairs split); ``--tp 1`` with it keeps the degree fixed."""
    model = "outcore:transformer:layers=2,d_model=64,heads=4,seq=16,vocab=256"
    tps = {}
    for extra in ([], ["--tp", "1"]):
        out = tmp_path / f"p{len(extra)}.json"
        r = subprocess.run(OUTCORE + ["plan", model, "--devices", "2", "--layout", "auto",
                                      "--costs", "estimate:cpu", "-o", str(out), *extra],
                           capture_output=True, text=True, timeout=300)
        assert r.returncode == 0, r.stderr
        doc = json.loads(out.read_text())
        tps[len(extra)] = {c["tp"] for c in doc["extra"]["candidates"]}
    assert tps == {0: {1, 2}, 2: {1}}


def test_a_replicated_plan_of_a_fixed_layout_is_shown_replicated():
    """``--parallel master`` without the layout search: the placements were timed on one copy,
    so the table shows the replicated plan (its own time), not one copy's times compared with
    it."""
    from outcore.graph.generators import make

    g = make("nas", 400)
    p = outcore.plan(g, outcore.plan_request(4, None, parallel="master", bandwidth="16GB/s"))
    assert p.layout.replicated and len(p.extra["placements"]) > 1
    shown = rows(p)
    assert len(shown) == 1 and shown[0]["chosen"]
    assert shown[0]["iteration_s"] == p.predicted["iteration_s"]
