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
