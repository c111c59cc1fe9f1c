"""A checkpoint is keyed by parameter name only, so any layout of the same model resumes it:
more devices (2 -> 3), fewer (4 -> 2), another parallel mode (pipeline -> GEMS MAST). The
resumed steps must give the losses and final parameters of uninterrupted single-process training
(1e-5 relative: the layouts sum the same micro-batch gradients in other orders)."""

from __future__ import annotations

import pytest

from outcore.config import TrainConfig
from outcore.runtime import checkpoint
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from tests.runtime.helpers import assert_matches, chunks, docs_for, reference

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(240)]

BASE = dict(model="outcore:mlp", batch_size=8, microbatches=2, optimizer="adam", lr=1e-2,
            track_memory=False)


def _train(cfg: TrainConfig, layout: tuple[int, str]):
    devices, mode = layout
    if mode == "mast":
        docs = docs_for(cfg, lambda g: chunks(g, devices), devices, parallel="mast",
                        replicas=2)
    else:
        docs = docs_for(cfg, lambda g: chunks(g, devices), devices)
    return run_local(train_worker, devices, (cfg, docs[0], docs[1]), timeout_s=60)


@pytest.mark.parametrize("first,second", [((2, "mp"), (3, "mp")), ((4, "mp"), (2, "mp")),
                                          ((2, "mp"), (2, "mast"))],
                         ids=["2-to-3", "4-to-2", "pipeline-to-mast"])
def test_resume_on_another_layout(tmp_path, first, second):
    ckpt = str(tmp_path / "ckpt")
    _train(TrainConfig.make(**BASE, steps=2, checkpoint_dir=ckpt, checkpoint_every=2), first)
    assert checkpoint.latest(ckpt)[0] == 2
    cfg = TrainConfig.make(**BASE, steps=4, checkpoint_dir=ckpt, resume=True, return_state=True)
    resumed = _train(cfg, second)
    ref_losses, ref_state = reference(cfg)
    assert all(len(r["losses"]) == 2 for r in resumed)
    assert_matches(resumed, ref_losses[2:], ref_state)
