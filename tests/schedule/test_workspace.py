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


@pytest.mark.parametrize("kernel,size,big", [(7, 6, True), (5, 8, True), (3, 2, True),
                                             (3, 8, False)])
def test_a_channels_last_depthwise_backward_is_counted_as_the_allocator_takes_it(kernel, size,
                                                                                 big):
    """1 KiB per weight element for a kernel of 5 or more, and for a 3x3 kernel on fewer
    rows than it has; otherwise none beyond the model's tensors."""
    from outcore.graph.capture import capture
    from outcore.schedule.workspace import _depthwise_nhwc

    model = _NHWCBlock(48, kernel)
    x = torch.randn(2, size, size, 48, requires_grad=True)
    g = capture(model, (x,))
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
