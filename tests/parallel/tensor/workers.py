"""Worker functions for the tensor-parallel tests (module level, so spawn can pickle them).

Each worker builds the model from a seed, keeps a deep copy as the single-process reference,
parallelises the original, trains both on the same batches, and returns both trajectories."""

from __future__ import annotations

import copy

import torch
from torch import nn


def build(name: str) -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    """Model, a batch of inputs and of targets (class indices) for ``name``."""
    torch.manual_seed(0)
    if name == "mlp":
        from outcore.zoo.toy import mlp
        model = mlp(width=32, layers=4, in_features=16, num_classes=12)
        return model, torch.randn(8, 16), torch.randint(0, 12, (8,))
    if name == "transformer":
        from outcore.zoo.transformer import transformer
        model = transformer(layers=2, d_model=32, heads=4, vocab=64, seq=8)
        return model, torch.randint(0, 64, (4, 8)), torch.randint(0, 64, (4, 8))
    if name == "attn":
        model = AttnBlock()
        return model, torch.randn(4, 8, 32), torch.randint(0, 16, (4, 8))
    if name in ("gpt2", "llama"):
        import transformers
        transformers.logging.set_verbosity_error()
        if name == "gpt2":
            cfg = transformers.GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=64,
                                          n_positions=8, resid_pdrop=0.0, embd_pdrop=0.0,
                                          attn_pdrop=0.0, use_cache=False, bos_token_id=0,
                                          eos_token_id=0)
            model = transformers.GPT2LMHeadModel(cfg)
        else:
            cfg = transformers.LlamaConfig(num_hidden_layers=2, hidden_size=32,
                                           intermediate_size=64, num_attention_heads=4,
                                           num_key_value_heads=4, vocab_size=64,
                                           use_cache=False, bos_token_id=0, eos_token_id=0,
                                           pad_token_id=0)
            model = transformers.LlamaForCausalLM(cfg)
        return _Logits(model), torch.randint(0, 64, (4, 8)), torch.randint(0, 64, (4, 8))
    raise ValueError(name)


class _Logits(nn.Module):
    """A Hugging Face LM returning its logits tensor (the loss is computed outside)."""

    def __init__(self, lm: nn.Module):
        super().__init__()
        self.lm = lm

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.lm(input_ids=tokens).logits


def _loss(out: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), y.reshape(-1))


def _full(p: torch.Tensor) -> torch.Tensor:
    return (p.full_tensor() if hasattr(p, "full_tensor") else p).detach().clone()


def train_grid(ctx, name: str, rows: int, cols: int, steps: int = 3) -> dict:
    """``train_pair`` on AxoNN's 2-D grid (``mode="2d"``, ``rows x cols`` = every rank)."""
    return train_pair(ctx, name, "2d", "sgd", steps, grid=(rows, cols))


def train_pair(ctx, name: str, mode: str, optimizer: str, steps: int = 3,
               depth: int = 1, grid: tuple[int, int] | None = None) -> dict:
    """Train ``steps`` steps tensor-parallel and single-process; return both results.
    ``depth`` > 1: ``tp = world / depth`` and each depth group gets its slice of the batch."""
    from outcore.parallel.tensor import tensor_parallel

    model, x, y = build(name)
    ref = copy.deepcopy(model)
    tp = ctx.world_size // depth
    shards, shard = (tp, ctx.rank) if mode == "depth" else (depth, ctx.rank // tp)
    tensor_parallel(model, tp, mode=mode, example_inputs=x.chunk(shards)[shard],
                    min_split_bytes=0, depth=depth, grid=grid)
    make = (lambda ps: torch.optim.Adam(ps, lr=1e-2)) if optimizer == "adam" else \
        (lambda ps: torch.optim.SGD(ps, lr=0.1, momentum=0.9))
    opt, ref_opt = make(model.parameters()), make(ref.parameters())
    losses, ref_losses = [], []
    for step in range(steps):
        xs, ys = x + 0 if x.dtype != torch.float32 else x * (1 + step), y
        mine_x, mine_y = xs.chunk(shards)[shard], ys.chunk(shards)[shard]
        loss = _loss(model(mine_x), mine_y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        if shards > 1:  # each group saw its slice: the batch loss is the mean
            loss = loss.detach().clone()
            torch.distributed.all_reduce(loss)
            loss /= ctx.world_size
        losses.append(float(loss.detach()))
        ref_loss = _loss(ref(xs), ys)
        ref_loss.backward()
        ref_opt.step()
        ref_opt.zero_grad()
        ref_losses.append(float(ref_loss.detach()))
    layout = getattr(model, "outcore_tensor_layout")
    return {"rank": ctx.rank, "losses": losses, "ref_losses": ref_losses,
            "state": {k: _full(v) for k, v in model.named_parameters()},
            "ref_state": {k: _full(v) for k, v in ref.named_parameters()},
            "split": list(layout.split_modules), "pairs": len(layout.pairs)}


class AttnBlock(nn.Module):
    """Attention with separate q/k/v projections and a head reshape reading ``self.heads``,
    then an MLP: both pair Megatron-style."""

    def __init__(self, d: int = 32, heads: int = 4):
        super().__init__()
        self.q, self.k, self.v, self.o = (nn.Linear(d, d) for _ in range(4))
        self.heads = heads
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
        self.out = nn.Linear(d, 16)

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (f(x).view(b, t, self.heads, -1).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(y.transpose(1, 2).reshape(b, t, -1))
        x = x + self.fc2(torch.relu(self.fc1(x)))
        return self.out(x)


def train_auto(ctx, steps: int = 3) -> dict:
    """``auto_parallelize`` around the model's construction against the same model built
    whole from the same seed."""
    from outcore.parallel.tensor import auto_parallelize

    x = torch.randn(4, 8, 32, generator=torch.Generator().manual_seed(1))
    y = torch.randint(0, 16, (4, 8), generator=torch.Generator().manual_seed(2))
    torch.manual_seed(0)
    ref = AttnBlock()
    torch.manual_seed(0)
    with auto_parallelize(ctx.world_size, example_inputs=x, min_split_bytes=0) as built:
        model = AttnBlock()
    assert built.models == [model]
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    losses, ref_losses = [], []
    for _ in range(steps):
        for m, o, acc in ((model, opt, losses), (ref, ref_opt, ref_losses)):
            loss = _loss(m(x), y)
            loss.backward()
            o.step()
            o.zero_grad()
            acc.append(float(loss.detach()))
    layout = model.outcore_tensor_layout
    return {"rank": ctx.rank, "losses": losses, "ref_losses": ref_losses,
            "state": {k: _full(v) for k, v in model.named_parameters()},
            "ref_state": {k: _full(v) for k, v in ref.named_parameters()},
            "split": list(layout.split_modules), "pairs": len(layout.pairs),
            "heads": model.heads}


class FixedWidth(AttnBlock):
    """Merges the heads back with a hard-coded width: splitting by heads breaks it."""

    def __init__(self):
        super().__init__()
        self.width = 32

    def forward(self, x):
        b, t, _ = x.shape
        q, k, v = (f(x).view(b, t, self.heads, -1).transpose(1, 2)
                   for f in (self.q, self.k, self.v))
        y = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.out(x + self.o(y.transpose(1, 2).reshape(b, t, self.width)))


def split_fixed_width(ctx) -> dict:
    """``tensor_parallel``'s output check must refuse a model it splits wrongly."""
    from outcore.errors import ModelError
    from outcore.parallel.tensor import tensor_parallel

    torch.manual_seed(0)
    try:
        tensor_parallel(FixedWidth(), ctx.world_size, example_inputs=torch.randn(2, 8, 32),
                        min_split_bytes=0)
    except ModelError as e:
        return {"refused": str(e)}
    return {"refused": None}


def run_cases(ctx, cases: list[tuple]) -> dict:
    """Run several cases in one launch (spawning workers costs more than a case): each case is
    ``(key, fn_name, args)``; a failing case returns its error instead of stopping the rest."""
    import traceback
    out = {}
    for key, fn, args in cases:
        try:
            out[key] = globals()[fn](ctx, *args)
        except Exception as e:  # reported by the test of that case
            out[key] = {"error": f"{type(e).__name__}: {e}\n{traceback.format_exc()}"}
    return out
