"""Training starts from weights the user has (outcore.runtime.weights): a torch state dict or a
safetensors file given with --weights, or a local Hugging Face folder named hf:/path; each rank
takes its own tensors by name, and a file that does not fit the model is refused by name."""

from __future__ import annotations

import pytest
import torch

import outcore
from outcore.config import TrainConfig
from outcore.errors import UsageError
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from outcore.zoo import build_model
from tests.runtime.helpers import chunks
from tests.zoo.helpers import docs, llama_folder

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]


def _trained_state(cfg: TrainConfig, ranks: int = 2) -> dict[str, torch.Tensor]:
    graph_doc, plan_doc, _ = docs(cfg, lambda g: chunks(g, ranks), ranks)
    results = run_local(train_worker, ranks, (cfg, graph_doc, plan_doc), timeout_s=120)
    state: dict[str, torch.Tensor] = {}
    for r in results:
        state.update(r["state"])
    return state


@pytest.mark.parametrize("suffix", [".pt", ".safetensors"])
def test_a_weights_file_is_where_each_rank_starts(tmp_path, suffix):
    model = "outcore:transformer:layers=2"
    _, other = build_model(model, seed=7)  # not the run's seed
    want = {k: v.detach().clone() for k, v in other.state_dict().items()}
    path = str(tmp_path / f"w{suffix}")
    if suffix == ".pt":
        torch.save(want, path)
    else:
        from safetensors.torch import save_file
        save_file({k: v.contiguous() for k, v in want.items()}, path)
    cfg = TrainConfig.make(model=model, batch_size=4, microbatches=2, steps=1, optimizer="sgd",
                           lr=0.0, momentum=0.0, weights=path, return_state=True,
                           track_memory=False)
    state = _trained_state(cfg)
    names = dict(other.named_parameters())
    assert set(state) == set(names)
    for k, v in state.items():  # a step at learning rate 0: the file's values
        assert torch.equal(v, want[k]), k


def test_a_local_hugging_face_folder_trains_from_its_weights(tmp_path):
    pytest.importorskip("transformers")
    saved = llama_folder(tmp_path / "llama", seed=11)
    cfg = TrainConfig.make(model=f"hf:{tmp_path / 'llama'}", batch_size=4, microbatches=2,
                           steps=1, optimizer="sgd", lr=0.0, momentum=0.0, return_state=True,
                           track_memory=False)
    state = _trained_state(cfg)
    for k, v in state.items():
        assert torch.equal(v, dict(saved.named_parameters())[k]), k


def test_a_file_that_does_not_fit_the_model_is_refused(tmp_path):
    _, model = build_model("outcore:mlp")
    state = model.state_dict()
    first = next(iter(state))
    torch.save({k: v for k, v in state.items() if k != first}, tmp_path / "short.pt")
    cfg = TrainConfig.make(model="outcore:mlp", batch_size=4, steps=1,
                           weights=str(tmp_path / "short.pt"), track_memory=False)
    with pytest.raises(Exception, match=f"has no tensor for 1 parameter of the model \\({first}"):
        _trained_state(cfg, ranks=1)
    # a missing file: refused before capture
    with pytest.raises(UsageError, match="no weights file at"):
        outcore.train("outcore:mlp", 1, weights=str(tmp_path / "nope.pt"), steps=1)
