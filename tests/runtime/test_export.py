"""A run's weights leave it (outcore export): a local Hugging Face folder fine-tunes on 2 ranks
and its exported folder loads back into transformers, every tensor the run trained; a zoo
model's export loads into plain PyTorch with strict names."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import outcore
from outcore.runtime.export import model_state
from outcore.zoo import build_model
from tests.zoo.helpers import llama_folder

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

TRAIN = dict(batch_size=4, steps=2, optimizer="sgd", lr=0.05, momentum=0.0,
             costs="estimate:cpu", timeline=False, checkpoint_every=2)


def test_a_hugging_face_folder_fine_tunes_and_loads_back(tmp_path):
    transformers = pytest.importorskip("transformers")
    from safetensors.torch import load_file

    start = llama_folder(tmp_path / "llama", seed=5)
    config = start.config
    ckpt = tmp_path / "ckpt"
    outcore.train(f"hf:{tmp_path / 'llama'}", 2, layout="given", microbatches=2,
                  checkpoint_dir=str(ckpt), run_dir=str(tmp_path / "run"), **TRAIN)
    done = outcore.api.export(ckpt, tmp_path / "out")
    assert done["step"] == 2 and done.get("config")
    back, info = transformers.LlamaForCausalLM.from_pretrained(tmp_path / "out",
                                                               output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    _, trained = model_state(ckpt)
    before = dict(start.named_parameters())
    for name, p in back.named_parameters():
        assert torch.equal(p, trained[name]), name
    assert sum(not torch.equal(p, before[n]) for n, p in back.named_parameters()) > \
        len(before) // 2  # it trained
    # the exported model computes what the checkpoint's weights compute
    same = transformers.LlamaForCausalLM(config)
    same.load_state_dict(load_file(str(tmp_path / "out" / "model.safetensors")), strict=False)
    ids = torch.randint(0, 128, (2, 8))
    with torch.no_grad():
        assert torch.equal(back(ids).logits, same(ids).logits)


def test_a_zoo_export_loads_into_plain_pytorch(tmp_path):
    from safetensors.torch import load_file

    ckpt = tmp_path / "ckpt"
    outcore.train("outcore:mlp", 2, layout="given", microbatches=2, checkpoint_dir=str(ckpt),
                  run_dir=str(tmp_path / "run"), **TRAIN)
    r = subprocess.run([sys.executable, "-m", "outcore.cli.main", "export", str(ckpt), "-o",
                        str(tmp_path / "mlp.safetensors")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 0, r.stderr
    assert "step 2:" in r.stdout
    _, model = build_model("outcore:mlp")
    model.load_state_dict(load_file(str(tmp_path / "mlp.safetensors")), strict=True)
    # a folder that is not a checkpoint: one line, exit 2
    r = subprocess.run([sys.executable, "-m", "outcore.cli.main", "export", str(tmp_path), "-o",
                        str(tmp_path / "x.safetensors")], capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2 and "no complete checkpoint" in r.stderr
