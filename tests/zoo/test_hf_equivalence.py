"""Unmodified Hugging Face models (captured by torch.export) trained on 2 ranks equal plain
PyTorch training of the same model on the same batches: losses and every parameter.

GPT-2 ties its embedding and output weights (one tensor, placed at its first use; the output
layer's rank receives it and returns its gradient); Llama does not. Tolerance 1e-3 relative to
each tensor's largest entry (at least 1e-2): Adam turns the rounding noise of gradients that
vanish in theory (attention key biases) into updates of up to the learning rate."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from outcore.config import TrainConfig  # noqa: E402
from outcore.runtime.launch import run_local  # noqa: E402
from outcore.runtime.worker import train_worker  # noqa: E402
from tests.runtime.helpers import chunks  # noqa: E402
from tests.zoo.helpers import assert_close, docs, reference  # noqa: E402

pytestmark = [pytest.mark.dist, pytest.mark.slow, pytest.mark.timeout(400)]


@pytest.mark.parametrize("model", ["hf:gpt2:hidden_size=32", "hf:llama:hidden_size=32"])
def test_hf_model_on_two_ranks_equals_plain_pytorch(model):
    cfg = TrainConfig.make(model=model, batch_size=4, microbatches=2, steps=2, return_state=True,
                           track_memory=False)
    graph_doc, plan_doc, g = docs(cfg, lambda g: chunks(g, 2), 2)
    assert g.meta["capture"]["path"] == "export"
    results = run_local(train_worker, 2, (cfg, graph_doc, plan_doc), timeout_s=120)
    assert_close(results, *reference(cfg, g.meta["capture"].get("output")), rtol=1e-3)
