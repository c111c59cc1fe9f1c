"""Each pipeline rank builds only the parameters its pieces hold (the model built without its
weights, then its part: outcore.zoo.weightless.built_in_part), with the values the whole model
has, so training equals plain PyTorch from the same seed (zoo, timm and Hugging Face models)."""

from __future__ import annotations

import pytest

from outcore.config import TrainConfig
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from outcore.zoo import build_model
from tests.runtime.helpers import chunks
from tests.zoo.helpers import assert_close, docs, reference

pytestmark = [pytest.mark.dist, pytest.mark.timeout(400)]

MODELS = ["outcore:transformer:layers=2", "timm:resnet18:image_size=32",
          "hf:gpt2:hidden_size=32"]


@pytest.mark.parametrize("model", MODELS)
def test_ranks_build_their_part_and_train_as_one_process(model):
    cfg = TrainConfig.make(model=model, batch_size=4, microbatches=2, steps=2, optimizer="sgd",
                           lr=0.05, return_state=True, track_memory=False)
    graph_doc, plan_doc, g = docs(cfg, lambda g: chunks(g, 2), 2)
    results = run_local(train_worker, 2, (cfg, graph_doc, plan_doc), timeout_s=120)
    assert_close(results, *reference(cfg, g.meta["capture"].get("output")), rtol=1e-5)
    _, whole = build_model(model)
    whole_bytes = sum(p.numel() * p.element_size() for p in whole.parameters())
    for r in results:
        held = sum(v.numel() * v.element_size() for v in r["state"].values())
        # it allocated exactly the parameters it trains, less than the whole model
        assert r["built_bytes"] == held, (r["rank"], r["built_bytes"], held)
        assert 0 < r["built_bytes"] < whole_bytes
