"""A plan's memory limit holds when it trains: for a few layouts x models of the memory matrix
(``benchmarks/memory_layouts.py``), each planned under a limit its plain layout would pass,
every rank's measured peak (the CPU allocator's) stays within the limit and within 10 % under
the plan's own prediction of it."""

from __future__ import annotations

import pytest

import outcore

pytestmark = [pytest.mark.dist, pytest.mark.timeout(300)]

CNN = ("outcore:resnet_k:depth=11,width=8", (8, 3, 32, 32))
LM = ("outcore:transformer:layers=2,d_model=64,heads=4,seq=16,vocab=2048", None)
# a 2 MiB embedding and output layer, each split by vocabulary rows under tp
WIDE = ("outcore:transformer:layers=2,d_model=64,heads=4,seq=16,vocab=8192", None)
TIED = ("tests/runtime/tied_model.py:tied_lm_wide", None)  # a 1 MiB tied embedding and output
MiB = 2**20

CELLS = {  # model, devices, options, limit (MiB): under the plain layout's peak
    "cnn checkpointed pipeline": (CNN, 2, dict(strategy="pipeline", microbatches=2,
                                               memory_policy="checkpoint"), 5.8),
    "cnn data parallel": (CNN, 2, dict(dp=2), 4.5),
    "lm tensor parallel": (LM, 2, dict(tp=2), 5.5),
    # this rank's rows of the embedding's gradient (not the whole table's), the output layer's
    # local logits and gathered parts beside the joined ones
    "vocab split lm tensor parallel": (WIDE, 2, dict(tp=2), 16.0),
    "lm pipeline": (LM, 2, dict(strategy="pipeline", microbatches=2), 3.4),
    # the tied weight's gradients summed out of place (DTensors); the output layer's rank
    # keeps a copy of the weight, its gradient and state
    "tied lm tensor parallel": (TIED, 2, dict(tp=2), 7.5),
    "tied lm pipeline": (TIED, 2, dict(strategy="pipeline", microbatches=2), 5.5),
}


@pytest.mark.parametrize("cell", list(CELLS))
def test_measured_peaks_stay_under_the_limit(cell, tmp_path):
    (model, shape), devices, options, limit = CELLS[cell]
    r = outcore.train(model, devices, layout="given", batch_size=8, input_shape=shape, steps=2,
                      optimizer="sgd", momentum=0.0, costs="estimate:cpu", timeline=False,
                      memory=limit * MiB, run_dir=str(tmp_path / "run"), **options)
    predicted = [float(x) for x in r.per_rank("peak_bytes")]
    measured = [float(x) for x in r.peak_bytes]
    # the plan may use fewer devices than it was given (the local link's probed latency
    # depends on the machine's load): every rank it starts is held to its limit
    assert 1 <= len(measured) == len(predicted) <= devices
    for m, p in zip(measured, predicted):
        assert m <= limit * MiB, (cell, measured, predicted)
        # never over the prediction (by more than the tracker's 1 % and 16 KiB), and not far
        # under it where the rank holds much
        assert m <= p * 1.01 + 16 * 1024, (cell, measured, predicted)
    assert max(measured) >= 0.9 * max(predicted), (cell, measured, predicted)


def test_a_weight_two_layers_read_through_one_parameter_node_is_predicted(tmp_path):
    """torch.export captures hf:opt's tied embedding and output weight as one parameter node
    that both layers read: the output layer's gradient for it waits through the whole
    backward until the embedding's joins it (out of place). Its 1 MiB (a 4096-word
    vocabulary) put the measured peak 4 % over the prediction before the model held it."""
    pytest.importorskip("transformers")
    r = outcore.train("hf:opt:vocab_size=4096", 1, batch_size=4, microbatches=2, steps=2,
                      optimizer="sgd", costs="estimate:cpu", timeline=False,
                      run_dir=str(tmp_path / "run"))
    (m,), (p,) = [float(x) for x in r.peak_bytes], [float(x) for x in r.per_rank("peak_bytes")]
    assert 0.9 * p <= m <= p * 1.01 + 16 * 1024, (m, p)


def test_a_concatenated_parameters_gradient_view_pins_the_whole_gradient(tmp_path):
    """MobileBERT's output layer multiplies by ``cat([decoder.weight.t(), dense.weight])``:
    ``dense.weight``'s ``.grad`` is a view of the concatenation's gradient, stolen by
    autograd, and keeps all of it until the step ends (here ``dense.weight`` is empty, so its
    empty ``.grad`` held the tied part's 1 MiB: 8 % over before the model held it)."""
    pytest.importorskip("transformers")
    r = outcore.train("hf:mobilebert:vocab_size=4096", 1, batch_size=4, microbatches=2,
                      steps=2, optimizer="sgd", costs="estimate:cpu", timeline=False,
                      run_dir=str(tmp_path / "run"))
    (m,), (p,) = [float(x) for x in r.peak_bytes], [float(x) for x in r.per_rank("peak_bytes")]
    assert 0.9 * p <= m <= p * 1.01 + 16 * 1024, (m, p)


def test_a_column_split_layer_keeps_its_whole_input_for_its_backward(tmp_path):
    """Under tp a column-split Linear (q, k and v of T5's attention, its MLP's ``wi``) saves
    its whole, replicated input for its weight's gradient: the rank graph keeps that saved
    input whole (it halved it, and hf:t5 at tp 2 measured 1.6 % over its prediction)."""
    pytest.importorskip("transformers")
    r = outcore.train("hf:t5", 2, tp=2, batch_size=4, microbatches=2, steps=2,
                      optimizer="sgd", costs="estimate:cpu", timeline=False,
                      run_dir=str(tmp_path / "run"))
    assert r.plan.layout.tp == 2
    for m, p in zip((float(x) for x in r.peak_bytes), (float(x) for x in r.per_rank(
            "peak_bytes"))):
        # over: by more than the tracker's 1 % and 16 KiB together
        assert not (m > p * 1.01 and m - p > 16 * 1024), (m, p)
        assert m >= 0.9 * p, (m, p)


def test_a_sharded_pieces_gradients_are_counted_as_its_backward_makes_them(tmp_path):
    """Every backward of a sharded piece makes its whole gradients anew, layer by layer; GPT-2's
    last stage starts its backward at an output layer whose weight another piece owns, and
    counting all of its own gradients there put a bfloat16 rank 13 % under the prediction
    (1.17 MiB measured, 1.35 predicted), past the matrix's 10 %, and refused this request
    ("1.36 MiB per device fits")."""
    pytest.importorskip("transformers")
    r = outcore.train("hf:gpt2:hidden_size=64", 2, layout="given", dp=2, shard=2,
                      memory_policy="checkpoint", precision="bf16-mixed", batch_size=8,
                      steps=2, optimizer="sgd", momentum=0.0, costs="estimate:cpu",
                      timeline=False, memory=1.31 * MiB, run_dir=str(tmp_path / "run"))
    measured = [float(x) for x in r.peak_bytes]
    predicted = [float(x) for x in r.per_rank("peak_bytes")]
    for m, p in zip(measured, predicted):
        assert m <= 1.31 * MiB and m <= p * 1.01 + 16 * 1024, (measured, predicted)
    assert max(measured) >= 0.9 * max(predicted), (measured, predicted)


def test_a_product_of_broadcast_inputs_holds_their_full_size_gradients(tmp_path):
    """The backward of ``a * dt`` with ``a`` of shape ``[1, w, 1, n]`` and ``dt`` of ``[b, w,
    l, 1]`` (Mamba's discretisation) makes both inputs' gradients at the product's size before
    summing them down: 2 MiB beside the product's own gradient, which put the measured peak
    43 % over the prediction before the model held them."""
    _holds_on_one_device(tmp_path, "tests/runtime/broadcast_model.py:outer", task="regression")


def test_a_batched_product_with_a_broadcast_table_holds_its_copies(tmp_path):
    """``one_hot @ table`` with a one-hot of ``[b, 2, l, size]`` and a table of ``[2, size,
    width]`` (Gemma 4's vision position embeddings) copies the table once per sample for
    ``bmm`` and makes its gradient at that size before summing it down."""
    _holds_on_one_device(tmp_path, "tests/runtime/broadcast_model.py:table", task="regression")


def test_an_lstm_language_model_holds_onednns_workspace(tmp_path):
    """The zoo's LSTM LM: oneDNN's LSTM kernel saves a workspace for its backward and takes
    scratch in it that fake mode does not show (measured 1.35 times the prediction before
    the capture ran the layers for real)."""
    _holds_on_one_device(tmp_path, "outcore:lstm_lm", batch_size=4, microbatches=2)


def test_a_leaf_module_holds_its_inner_tensors(tmp_path):
    """A block torch.fx cannot trace is one node; its forward and backward hold tensors far
    larger than its output inside (here 512 times), which the capture measures on real
    tensors: under-predicted by more than half before."""
    _holds_on_one_device(tmp_path, "tests/runtime/broadcast_model.py:leaf", task="regression")


def test_attention_with_a_learned_bias_holds_its_scores(tmp_path):
    """``scaled_dot_product_attention`` with a mask that needs a gradient runs the CPU's math
    path: its forward and backward hold the scores and their softmax in full."""
    _holds_on_one_device(tmp_path, "tests/runtime/broadcast_model.py:biased_attention",
                         task="regression")


def _holds_on_one_device(tmp_path, model: str, **options) -> None:
    """``model`` trained on one device (2 SGD steps without momentum, estimated CPU costs):
    its measured peak inside its prediction (1 % and 16 KiB), and within 10 % under it."""
    r = outcore.train(model, 1, steps=2, optimizer="sgd", momentum=0.0, costs="estimate:cpu",
                      timeline=False, run_dir=str(tmp_path / "run"), **options)
    (m,), (p,) = [float(x) for x in r.peak_bytes], [float(x) for x in r.per_rank("peak_bytes")]
    assert 0.9 * p <= m <= p * 1.01 + 16 * 1024, (m, p)
