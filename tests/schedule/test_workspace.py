"""Operators' scratch memory against what the CPU allocator hands out."""

import pytest
import torch

from outcore.schedule.workspace import _onednn_bf16

# (rows, inner, columns) of products a model's linear layers and their backward make
SHAPES = [(8, 32, 32), (64, 64, 192), (128, 64, 64), (192, 64, 64), (64, 512, 64),
          (320, 64, 256), (256, 1024, 1024), (512, 2048, 512), (16, 8, 32)]


def _scratch(a: torch.Tensor, b: torch.Tensor) -> int:
    """The largest allocation one ``a @ b`` makes beside its result."""
    a @ b  # oneDNN builds its kernel on the first call
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        out = a @ b
    sizes = [e.nbytes() for e in prof.profiler.kineto_results.events() if e.nbytes() > 0]
    result = out.untyped_storage().nbytes()
    if result in sizes:
        sizes.remove(result)
    return max(sizes, default=0)


@pytest.mark.parametrize("m,k,n", SHAPES)
@pytest.mark.parametrize("transposed", [False, True])
def test_bf16_product_scratch_is_bounded(m, k, n, transposed):
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as outcore's workers run
    try:
        a = torch.randn(m, k, dtype=torch.bfloat16)
        if transposed:  # a weight's gradient multiplies a transposed activation
            a = a.t().contiguous().t()
        b = torch.randn(k, n, dtype=torch.bfloat16)
        taken = _scratch(a, b)
    finally:
        torch.set_num_threads(threads)
    bound = _onednn_bf16(m, k, n)
    assert taken <= bound, (m, k, n, transposed, taken, bound)
    if m * k * n > 16 ** 3 and taken:  # a bound, not a blanket: within 4x of what it
        # took, or under 2 MiB where a large product's blocks are packed without A's
        assert bound <= max(4 * taken, 2 * 2**20), (m, k, n, transposed, taken, bound)


def test_small_and_vector_products_take_none():
    assert _onednn_bf16(1, 4096, 4096) == 0.0
    assert _onednn_bf16(16, 16, 16) == 0.0
    assert _onednn_bf16(8, 32, 32) > 0.0


class _NHWCBlock(torch.nn.Module):
    """A ConvNeXt block's start: a depthwise convolution of an NHWC tensor."""

    def __init__(self, channels: int = 48, kernel: int = 7):
        super().__init__()
        self.dw = torch.nn.Conv2d(channels, channels, kernel, padding=kernel // 2,
                                  groups=channels)

    def forward(self, x):  # x: N, H, W, C
        return self.dw(x.permute(0, 3, 1, 2)).sum(dim=(2, 3))


@pytest.mark.parametrize("path", ["fx", "export"])
@pytest.mark.parametrize("kernel,size,big", [(7, 6, True), (5, 8, True), (3, 2, True),
                                             (3, 8, False)])
def test_a_channels_last_depthwise_backward_is_counted_as_the_allocator_takes_it(kernel, size,
                                                                                 big, path):
    """1 KiB per weight element for a kernel of 5 or more, and for a 3x3 kernel on fewer
    rows than it has; otherwise none beyond the model's tensors. An exported graph's
    ``aten.conv2d`` (Hugging Face's ConvNeXt) has its groups and kernel from its arguments."""
    from outcore.graph.capture import capture
    from outcore.schedule.workspace import _depthwise_nhwc

    model = _NHWCBlock(48, kernel)
    x = torch.randn(2, size, size, 48, requires_grad=True)
    g = capture(model, (x,), path=path)
    conv = int(g.nodes_with_op("conv2d")[0])
    assert g.attr(conv, "channels_last")
    bound = _depthwise_nhwc(g, conv, g.attr(conv, "config"), False)
    y = model.dw(x.permute(0, 3, 1, 2))
    grad = torch.randn_like(y)
    torch.autograd.grad(y, (x, model.dw.weight), grad, retain_graph=True)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        torch.autograd.grad(y, (x, model.dw.weight), grad, retain_graph=True)
    taken = max(e.nbytes() for e in prof.profiler.kineto_results.events())
    weight_kib = 48 * kernel * kernel * 1024
    assert (taken >= weight_kib) == big, taken
    assert bound == (weight_kib if big else 0.0)
    # the same convolution of a contiguous input takes no such buffer
    plain = capture(model.dw, (torch.randn(2, 48, size, size),))
    assert not plain.attr(int(plain.nodes_with_op("conv2d")[0]), "channels_last")


def test_a_one_pixel_nhwc_input_is_channels_last_as_torch_takes_it():
    """CoaT's attention maps a 1x1 image back with NHWC strides: contiguous both ways, and
    torch's convolution takes it channels-last (a depthwise 7x7 then allocates 1 KiB a weight
    element); a contiguous 1x1 image is not marked."""
    from outcore.graph.capture import capture

    model = torch.nn.Conv2d(24, 24, 7, padding=3, groups=24)
    nhwc = torch.randn(2, 1, 24).transpose(1, 2).reshape(2, 24, 1, 1)
    assert nhwc.is_contiguous() and nhwc.is_contiguous(memory_format=torch.channels_last)
    g = capture(model, (nhwc,))
    assert g.attr(int(g.nodes_with_op("conv2d")[0]), "channels_last")
    g = capture(model, (torch.randn(2, 24, 1, 1),))
    assert not g.attr(int(g.nodes_with_op("conv2d")[0]), "channels_last")


@pytest.mark.parametrize("between", ["GroupNorm", "group_norm", "roll", "ChannelShuffle"])
@pytest.mark.parametrize("fake", [True, False], ids=["fake", "real"])
def test_a_layer_the_cpu_keeps_in_nhwc_leaves_the_next_convolution_channels_last(between, fake):
    """A group norm, a roll or a channel shuffle of an NHWC input returns NHWC on the CPU,
    and contiguous in a fake run: the capture takes the convolution after it as the CPU runs
    it, channels-last (timm's cpubone_nano, whose NHWC convolutions copy their weight three
    times in the backward, measured 2.2 MiB over a stage's prediction when they were not)."""
    from outcore.graph.capture import capture

    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.norm = torch.nn.GroupNorm(2, 16)
            self.shuffle = torch.nn.ChannelShuffle(2)
            self.conv = torch.nn.Conv2d(16, 32, 3, padding=1)

        def forward(self, x):
            x = x.contiguous(memory_format=torch.channels_last)
            if between == "GroupNorm":
                x = self.norm(x)
            elif between == "group_norm":
                x = torch.nn.functional.group_norm(x, 4)
            elif between == "roll":
                x = torch.roll(x, 1, 2)
            else:
                x = self.shuffle(x)
            return self.conv(x)

    x = torch.randn(2, 16, 8, 8)
    out = Net()(x)  # as the CPU runs it
    assert out.is_contiguous(memory_format=torch.channels_last) and not out.is_contiguous()
    g = capture(Net(), (x,), fake=fake)
    assert g.attr(int(g.nodes_with_op("conv2d")[0]), "channels_last")


class _Conv(torch.nn.Module):
    """One convolution, of the model's input or of an activation (whose gradient it makes)."""

    def __init__(self, conv: torch.nn.Module, of_input: bool):
        super().__init__()
        self.conv, self.of_input = conv, of_input

    def forward(self, x):
        return self.conv(x if self.of_input else x * 1.0)


def _conv_scratch(conv: torch.nn.Module, x: torch.Tensor, grad_in: bool) -> tuple[int, int]:
    """What the allocator hands out inside ``conv``'s forward and backward beyond the
    forward's output and the backward's gradients, after a first call that builds oneDNN's
    kernels."""
    from outcore.hardware.memtrack import allocated_peak

    x = x.detach().requires_grad_(grad_in)
    conv(x).backward(torch.randn_like(conv(x)))
    conv.zero_grad(set_to_none=True)
    x.grad = None
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        y = conv(x)
    forward = allocated_peak(prof) - y.numel() * y.element_size()
    grad = torch.randn_like(y)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        y.backward(grad)
    grads = [p for p in conv.parameters()] + ([x] if grad_in else [])
    backward = allocated_peak(prof) - sum(t.numel() * t.element_size() for t in grads)
    return forward, backward


# (input shape, conv, of the model's input): convolutions oneDNN runs as im2col and a matrix
# product: a ViT's patches, a 1-d kernel of 15 taps, a 31x31 depthwise kernel (RepLKNet), a
# grouped 128-tap 1-d kernel (wav2vec 2's positions), a 3-d patch kernel, and a dilated 3x3 at
# 1x1 pixels (SKNet's last stage)
GEMM_CASES = [
    ((2, 3, 32, 32), lambda: torch.nn.Conv2d(3, 96, 16, stride=16), True),
    # a 224-pixel image of 3 channels: no channel blocks (16 of them would be 5.3 images)
    ((2, 3, 224, 224), lambda: torch.nn.Conv2d(3, 64, 16, stride=16), True),
    ((2, 16, 64), lambda: torch.nn.Conv1d(16, 64, 15), False),
    ((2, 32, 16, 16), lambda: torch.nn.Conv2d(32, 32, 31, padding=15, groups=32), False),
    ((2, 64, 100), lambda: torch.nn.Conv1d(64, 64, 128, padding=64, groups=16), False),
    ((2, 3, 4, 32, 32), lambda: torch.nn.Conv3d(3, 32, (2, 16, 16), stride=(2, 16, 16)), True),
    ((2, 128, 1, 1), lambda: torch.nn.Conv2d(128, 128, 3, padding=2, dilation=2), False),
]


@pytest.mark.parametrize("shape,make,of_input", GEMM_CASES,
                         ids=["patches", "patches-224", "1d-15", "dw-31", "grouped-1d", "3d",
                              "dilated"])
def test_a_convolution_run_as_a_matrix_product_is_bounded_by_its_scratch(shape, make, of_input):
    from outcore.graph.capture import capture
    from outcore.schedule.workspace import workspace_bytes

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as outcore's workers run
    try:
        torch.manual_seed(0)
        model = _Conv(make(), of_input)
        x = torch.randn(*shape)
        g = capture(model, (x,))
        conv = int(next(i for i in range(g.num_nodes) if "conv" in g.op_of(i)))
        fwd, bwd = workspace_bytes(g)
        taken_fwd, taken_bwd = _conv_scratch(model.conv, x, grad_in=not of_input)
    finally:
        torch.set_num_threads(threads)
    assert taken_fwd <= fwd[conv] and taken_bwd <= bwd[conv], \
        (taken_fwd, fwd[conv], taken_bwd, bwd[conv])
    # the backward's columns and weight copies are what it takes, not a blanket over them
    assert bwd[conv] <= 1.1 * taken_bwd + 4096, (taken_bwd, bwd[conv])


# (channels in, out, kernel, stride, pixels): non-depthwise convolutions of an NHWC input
# (GCViT's and DaViT's downsampling, a small-channel stem)
NHWC_CASES = [(64, 128, 3, 2, 8), (32, 32, 3, 1, 16), (128, 128, 2, 2, 8), (3, 32, 7, 2, 16)]


@pytest.mark.parametrize("cin,cout,kernel,stride,size", NHWC_CASES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_a_channels_last_convolution_is_bounded_by_its_weight_copies(cin, cout, kernel, stride,
                                                                     size, dtype):
    from outcore.graph.capture import capture
    from outcore.schedule.workspace import workspace_bytes

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        torch.manual_seed(0)
        conv = torch.nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2).to(dtype)
        model = _Conv(conv, False)
        x = torch.randn(2, size, size, cin, dtype=dtype).permute(0, 3, 1, 2)
        g = capture(model, (x,))
        node = int(g.nodes_with_op("conv2d")[0])
        assert g.attr(node, "channels_last")
        fwd, bwd = workspace_bytes(g)
        taken_fwd, taken_bwd = _conv_scratch(conv, x, grad_in=True)
    finally:
        torch.set_num_threads(threads)
    assert taken_fwd <= fwd[node] and taken_bwd <= bwd[node], \
        (taken_fwd, fwd[node], taken_bwd, bwd[node])
    if cin >= 16:  # three weight copies and an activation at most, not the blocked copies
        assert bwd[node] <= 1.5 * taken_bwd + 16384, (taken_bwd, bwd[node])


def test_a_dropout_drawn_per_sample_holds_its_parts_beside_their_join():
    """outcore runs a random node sample by sample: forward, the parts and the joined output
    are alive together; a dropout of probability 0 runs as it is and takes nothing."""
    from outcore.graph.capture import capture
    from outcore.schedule.workspace import workspace_bytes

    model = torch.nn.Sequential(torch.nn.Linear(8, 64), torch.nn.Dropout(0.5),
                                torch.nn.Linear(64, 64), torch.nn.Dropout(0.0))
    g = capture(model, (torch.randn(4, 8),))
    fwd, bwd = workspace_bytes(g)
    drops = [int(i) for i in g.nodes_with_op("dropout")]
    assert [g.attr(i, "config")["p"] for i in drops] == [0.5, 0.0]
    assert fwd[drops[0]] == g.out_bytes[drops[0]] == 4 * 64 * 4
    assert fwd[drops[1]] == 0.0 and bwd[drops[0]] == bwd[drops[1]] == 0.0


def _live_peak(fn) -> tuple[int, torch.Tensor]:
    """The most bytes ``fn()`` held at once beyond what it was given, and its result."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                                profile_memory=True) as prof:
        out = fn()
    live = top = 0
    for _, nbytes in sorted((e.start_ns(), e.nbytes())
                            for e in prof.profiler.kineto_results.events() if e.nbytes()):
        live += nbytes
        top = max(top, live)
    return top, out


@pytest.mark.parametrize("samples,tp", [(1, 2), (4, 2), (2, 4), (4, 4)])
def test_a_dropout_on_a_tensor_parallel_shard_stays_inside_its_bound(samples, tp):
    """A dropout between a Megatron pair's layers draws each sample whole on a rank: what it
    holds (the parts, each sample's whole draw, the masks it keeps for backward) stays inside
    the rank graph's workspace plus saved bytes of the node (saved: not divided by tp)."""
    from outcore.core import randomness
    from outcore.cost.tensor import tensor_graph
    from outcore.graph.capture import capture
    from outcore.hardware.spec import LinkSpec
    from outcore.schedule.workspace import workspace_bytes
    from tests.runtime.dropout_model import TensorDropMLP

    torch.manual_seed(0)
    g = capture(TensorDropMLP(width=16, hidden=512), (torch.randn(samples, 16),))
    tg, _ = tensor_graph(g, tp, LinkSpec(bandwidth=1e9, latency_s=0.0))
    drop = int(g.nodes_with_op("dropout")[0])
    assert drop in tg.meta["tp_sharded"]
    assert tg.saved_bytes[drop] == g.saved_bytes[drop]
    fwd, _ = workspace_bytes(tg)
    bound = fwd[drop] + tg.saved_bytes[drop]

    randomness.set_shards(tp - 1, tp, {"drop": g.attr(drop, "shape")}, samples)
    randomness.set_context(0, 0, 0, samples)
    randomness._TARGETS.setdefault("test.dropout", torch.nn.functional.dropout)
    x = torch.randn(samples, 512 // tp, requires_grad=True)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        taken, out = _live_peak(lambda: randomness.per_sample("drop", "test.dropout", x, 0.5))
    finally:
        torch.set_num_threads(threads)
        randomness.set_shards(0, 1, {}, 0)
    assert tuple(out.shape) == tuple(x.shape)
    taken -= out.numel() * out.element_size()  # the output is the graph's, not scratch
    assert 0 < taken <= bound, (taken, bound)


# (channels in, out, kernel, stride, pixels, samples): direct convolutions oneDNN runs on
# channel blocks, where the blocks alone missed scratch: a strided 1x1 at 56 pixels, a small
# strided 3x3, a batch-1 3x3 PyTorch runs without oneDNN (im2col), bfloat16 3x3 and 1x1 ones
# that keep float32 accumulators of a sample, and a ResNet's strided 1x1 shortcut
DIRECT_CASES = [
    (24, 96, 1, 2, 56, 1, torch.float32), (8, 8, 3, 2, 8, 2, torch.float32),
    (24, 24, 3, 1, 28, 1, torch.float32), (96, 96, 3, 1, 56, 1, torch.bfloat16),
    (24, 24, 1, 1, 56, 1, torch.bfloat16), (32, 64, 1, 2, 32, 4, torch.bfloat16),
]


@pytest.mark.parametrize("cin,cout,kernel,stride,size,samples,dtype", DIRECT_CASES,
                         ids=["1x1-s2-56", "3x3-s2-8", "3x3-batch1", "bf16-3x3-56",
                              "bf16-1x1-56", "bf16-1x1-s2"])
def test_a_direct_convolution_is_bounded_by_its_scratch(cin, cout, kernel, stride, size,
                                                        samples, dtype):
    from outcore.graph.capture import capture
    from outcore.schedule.workspace import workspace_bytes

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as outcore's workers run
    try:
        torch.manual_seed(0)
        conv = torch.nn.Conv2d(cin, cout, kernel, stride=stride, padding=kernel // 2).to(dtype)
        model = _Conv(conv, False)
        x = torch.randn(samples, cin, size, size, dtype=dtype)
        g = capture(model, (x,))
        node = int(g.nodes_with_op("conv2d")[0])
        fwd, bwd = workspace_bytes(g)
        _, taken = _conv_scratch(conv, x, grad_in=True)
    finally:
        torch.set_num_threads(threads)
    assert taken <= bwd[node], (taken, bwd[node])
    assert bwd[node] <= 2.0 * taken + 65536, (taken, bwd[node])


class _Products(torch.nn.Module):
    """A table product with a broadcast operand, and a linear-style one torch folds; with
    ``grad_in``, the product's other operand needs a gradient (it passes a linear layer)."""

    def __init__(self, grad_in: bool):
        super().__init__()
        self.table = torch.nn.Parameter(torch.randn(2, 32, 8))
        self.weight = torch.nn.Parameter(torch.randn(16, 8))
        self.pre = torch.nn.Linear(32, 32) if grad_in else torch.nn.Identity()

    def forward(self, x):  # x: [b, 2, l, 32]
        x = self.pre(x)
        return (x @ self.table).sum(1) + x[:, 0, :, :16] @ self.weight


@pytest.mark.parametrize("grad_in", [False, True])
def test_a_batched_product_copies_its_broadcast_operand_at_the_output_batch(grad_in):
    """``x @ table`` of ``[b, 2, l, k]`` and ``[2, k, n]``: the table is copied for each of the
    ``b`` samples (scratch of the forward when nothing saves it, held when ``x`` needs a
    gradient and the product saves it), and its gradient made at that size; the folded
    ``[b, l, 16] @ [16, 8]`` copies nothing."""
    from outcore.graph.capture import capture
    from outcore.schedule.workspace import matmul_broadcast_scratch

    g = capture(_Products(grad_in), torch.randn(4, 2, 6, 32))
    fwd, bwd = matmul_broadcast_scratch(g)
    products = [i for i in range(g.num_nodes) if g.ops[i] == "matmul"]
    copy = 4 * 2 * 32 * 8 * 4
    assert [fwd[i] for i in products] == [0 if grad_in else copy, 0]
    assert [bwd[i] for i in products] == [copy, 0]
