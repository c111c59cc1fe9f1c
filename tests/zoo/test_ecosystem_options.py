"""Options of ecosystem names: ``task=`` as set by ``--task``, and ``dtype=float64``."""

from __future__ import annotations

import pytest
import torch

from outcore.errors import UsageError
from outcore.zoo import build_model
from outcore.zoo.ecosystem import with_task


def test_with_task_sets_the_option_of_ecosystem_names_only():
    assert with_task("timm:resnet18", "regression") == "timm:resnet18:task=regression"
    assert with_task("hf:bert:hidden_size=32,task=masked_lm", "classification") == \
        "hf:bert:hidden_size=32,task=classification"
    assert with_task("outcore:mlp", "regression") == "outcore:mlp"
    with pytest.raises(UsageError, match="unknown task"):
        with_task("timm:resnet18", "segmentation")


def test_timm_float64_and_regression_head():
    pytest.importorskip("timm")
    spec, net = build_model("timm:resnet18:image_size=32,dtype=float64,task=regression",
                            batch_size=2)
    assert spec.example_inputs[0].dtype == torch.float64
    assert all(p.dtype == torch.float64 for p in net.parameters())
    assert net(*spec.example_inputs).shape == (2, 1) and spec.task == "regression"
    with pytest.raises(UsageError, match="dtype=float16 is not supported"):
        build_model("timm:resnet18:dtype=float16", batch_size=2)


@pytest.mark.parametrize("name,check", [
    # a head width of its own (Helium multiplied 2 x 128-wide heads into a 32-wide layer)
    ("hf:helium:hidden_size=32", lambda c: c.head_dim * c.num_attention_heads == 32),
    # key/value heads left None by the config (Nemotron divided by them)
    ("hf:nemotron", lambda c: c.num_key_value_heads == c.num_attention_heads),
    # an embedding as wide as the layers (SqueezeBERT asserts it)
    ("hf:squeezebert", lambda c: c.embedding_size == c.hidden_size == 64),
    # XLNet's head width, and no sequence length to set (it keeps its own, sizes stay tiny)
    ("hf:xlnet", lambda c: c.d_head * c.n_head == c.d_model == 64),
    # a composite model: its language part tiny too, not the full default
    ("hf:gemma3", lambda c: c.text_config.hidden_size == 64
     and c.text_config.num_hidden_layers == 2),
    # a layer pattern that does not allow 2 layers (GPT-Neo): its own layer count, tiny widths
    ("hf:gpt_neo", lambda c: c.hidden_size == 64),
    # a masked LM without a padding id (ESM finds positions by comparing tokens with it)
    ("hf:esm", lambda c: c.pad_token_id == c.vocab_size - 1),
    # no key/value cache in any part of a composite model (a cache is not a pytree)
    ("hf:gemma3", lambda c: c.use_cache is False and c.text_config.use_cache is False),
])
def test_tiny_hugging_face_sizes_agree_with_each_model_type(name, check):
    pytest.importorskip("transformers")
    spec, net = build_model(name, batch_size=2)
    config = net.config
    assert check(config), config
    assert sum(p.numel() for p in net.parameters()) < 20_000_000


def test_sizes_the_user_gives_are_kept_or_refused_in_one_line():
    pytest.importorskip("transformers")
    from outcore.errors import ModelError
    spec, net = build_model("hf:llama:hidden_size=48,num_attention_heads=4,"
                            "num_key_value_heads=2,head_dim=12", batch_size=2)
    c = net.config
    assert (c.hidden_size, c.num_attention_heads, c.num_key_value_heads, c.head_dim) == \
        (48, 4, 2, 12)
    with pytest.raises(ModelError, match="cannot build hf:llama.*nosuch"):
        build_model("hf:llama:hidden_act=nosuch", batch_size=2)


@pytest.mark.parametrize("name,shape,check", [
    ("hf:vit", (2, 3, 32, 32), lambda c: c.image_size == 32 and c.hidden_size == 64),
    # per-stage widths and one block a stage (a layer count would cut the stages)
    ("hf:convnext", (2, 3, 32, 32), lambda c: list(c.depths) == [1] * 4
     and list(c.hidden_sizes) == [16, 32, 64, 128]),
    # windows of 4 patches, and images large enough for the last stage to hold one
    ("hf:swin", (2, 3, 128, 128), lambda c: c.window_size == 4),
    # several classifier classes (with and without a teacher): the first
    ("hf:deit", (2, 3, 32, 32), lambda c: c.image_size == 32),
    # head counts per stage stay its own
    ("hf:levit", (2, 3, 32, 32), lambda c: isinstance(c.num_attention_heads, (list, tuple))),
    ("hf:vit:image_size=48", (2, 3, 48, 48), lambda c: c.image_size == 48),
])
def test_hugging_face_image_classifiers_build_tiny_and_classify(name, shape, check):
    """``hf:`` names an image classifier (AutoModelForImageClassification) as well as a
    language model: random images of its image size, its logits one row per image."""
    pytest.importorskip("transformers")
    spec, net = build_model(name, batch_size=2)
    (x,) = spec.example_inputs
    assert tuple(x.shape) == shape and x.dtype == torch.float32
    assert spec.task == "classification" and spec.int_high == (None,)
    assert check(net.config), net.config
    assert sum(p.numel() for p in net.parameters()) < 20_000_000
    assert net(x).logits.shape[0] == 2


def test_an_image_classifier_takes_its_image_size_from_the_input_shape():
    pytest.importorskip("transformers")
    spec, net = build_model("hf:vit", input_shape=(3, 3, 64, 48))
    assert tuple(spec.example_inputs[0].shape) == (3, 3, 64, 48)
    assert tuple(net.config.image_size) == (64, 48)
    with pytest.raises(UsageError, match="BATCHxCHANNELSxHEIGHTxWIDTH"):
        build_model("hf:vit", input_shape=(2, 16))


def test_a_type_that_is_neither_a_language_model_nor_a_classifier_says_so():
    pytest.importorskip("transformers")
    from outcore.errors import ModelError
    with pytest.raises(ModelError, match="not a language model, text classifier or image"):
        build_model("hf:maskformer-swin", batch_size=2)


def test_a_masked_lm_without_a_padding_id_runs_its_forward():
    pytest.importorskip("transformers")
    spec, net = build_model("hf:esm", batch_size=2)
    assert net(*spec.example_inputs).logits.shape[:2] == spec.example_inputs[0].shape


def test_axial_position_embeddings_cover_the_sequence():
    """Reformer in training takes only sequences as long as its axial position grid (64 x 64
    by default): the tiny model's grid is fitted to the sequence, unless the user gives it."""
    pytest.importorskip("transformers")
    from outcore.zoo import resolve_model

    spec = resolve_model("hf:reformer")
    assert spec.example_inputs[0].shape == (2, 16)
    assert spec.build().config.axial_pos_shape == (4, 4)
    given = resolve_model("hf:reformer:seq=24")
    assert given.build().config.axial_pos_shape == (4, 6)


@pytest.mark.parametrize("name,check", [
    # latent attention's head width is its rotary width: Youtu rotates by it
    ("hf:youtu", lambda c: c.head_dim == c.qk_rope_head_dim),
    # a default that routes each token to no expert (num_experts_per_tok None)
    ("hf:deepseek_v2", lambda c: c.num_experts_per_tok == 2),
])
def test_tiny_hugging_face_models_run_on_their_own_inputs(name, check):
    pytest.importorskip("transformers")
    from outcore.graph.capture import capture

    spec, net = build_model(name, batch_size=2)
    assert check(net.config), net.config
    g = capture(net, spec.example_inputs)  # as training traces it (failed on the model before)
    out = int(g.nodes_with_op("output")[0])
    assert g.attr(int(g.predecessors(out)[0]), "shape")[:2] == list(spec.example_inputs[0].shape)
