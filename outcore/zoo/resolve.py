"""Turn a model name into a model builder and an example input.

Five forms (docs/models.md, "Naming a model"): ``torchvision:<builder>``, ``outcore:<zoo model>``,
``hf:<model type>`` and ``timm:<name>`` (:mod:`outcore.zoo.ecosystem`, optional extras), and
``path/to/file.py:function`` (the function returns a module, or a ``(module, example_input)`` pair).
Builder options follow a second colon: ``outcore:resnet_k:depth=110,width=16``,
``torchvision:resnet50:num_classes=10``. No weights are ever downloaded.
"""

from __future__ import annotations

import ast
import difflib
import importlib.util
import inspect
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from outcore.errors import ModelError, UsageError
from outcore.zoo import amoeba, lstm, resnet, toy, transformer
from outcore.zoo.weightless import parameters_on_meta, probe

Inputs = tuple[torch.Tensor, ...]


@dataclass(frozen=True)
class ZooEntry:
    builder: Callable[..., nn.Module]
    make_input: Callable[[dict[str, Any], int], Inputs]  # (options, batch) -> example inputs
    summary: str


def _image(default_size: int) -> Callable[[dict[str, Any], int], Inputs]:
    def make(opts: dict[str, Any], batch: int) -> Inputs:
        size = int(opts.get("image_size", default_size))
        return (torch.randn(batch, 3, size, size),)
    return make


def _tokens(default_seq: int) -> Callable[[dict[str, Any], int], Inputs]:
    def make(opts: dict[str, Any], batch: int) -> Inputs:
        seq, vocab = int(opts.get("seq", default_seq)), int(opts.get("vocab", 256))
        return (torch.randint(0, vocab, (batch, seq)),)
    return make


def _features(n_inputs: int) -> Callable[[dict[str, Any], int], Inputs]:
    def make(opts: dict[str, Any], batch: int) -> Inputs:
        return tuple(torch.randn(batch, int(opts.get("in_features", 16)))
                     for _ in range(n_inputs))
    return make


ZOO: dict[str, ZooEntry] = {
    "resnet_k": ZooEntry(resnet.resnet_k, _image(32),
                         "pre-activation bottleneck ResNet, depth 9n+2 (GEMS' ResNet-1k family)"),
    "wide_resnet": ZooEntry(resnet.wide_resnet, _image(32), "wide ResNet WRN-depth-widen"),
    "amoebanet": ZooEntry(amoeba.amoebanet, _image(32), "AmoebaNet-like multi-branch cells"),
    "transformer": ZooEntry(transformer.transformer, _tokens(32),
                            "transformer LM, attention heads as separate branches (SUPER)"),
    "lstm_lm": ZooEntry(lstm.lstm_lm, _tokens(16), "stacked-LSTM LM (unroll=True: cell grid)"),
    "mlp": ZooEntry(toy.mlp, _features(1), "tiny chain of Linear+Tanh layers (tests)"),
    "diamond": ZooEntry(toy.diamond, _features(1), "tiny fork/join with a long skip (tests)"),
    "two_tower": ZooEntry(toy.two_tower, _features(2), "tiny model, two inputs, two outputs"),
}

# Image sizes torchvision classifiers need when no --input-shape is given.
_TV_SIZES = {"inception_v3": 299}


def zoo_names() -> list[str]:
    return sorted(ZOO)


@dataclass(frozen=True)
class ModelSpec:
    """A resolved model: how to build it and what it eats.

    Attributes:
        name: the spec string the user gave.
        build: builds a fresh model (call after seeding for reproducible weights).
        example_inputs: example inputs at ``batch_size`` (batch is dimension 0 of each).
        int_high: per input, the exclusive upper bound of integer inputs (token ids), or None.
        task: what the targets are (``causal_lm``, ``masked_lm``, ``seq2seq_lm``,
            ``classification``, ``regression``), or None: inferred from the output's shape.
        task_options: what the task needs (``mask_token_id`` of a masked LM).
        weights: the weights the model starts from when no ``--weights`` is given (a local
            Hugging Face folder's ``*.safetensors``), or None: its own initialisation.
    """

    name: str
    build: Callable[[], nn.Module]
    example_inputs: Inputs
    int_high: tuple[int | None, ...] = field(default=())
    task: str | None = None
    task_options: dict[str, Any] = field(default_factory=dict)
    weights: str | None = None

    @property
    def batch_size(self) -> int:
        return int(self.example_inputs[0].shape[0])

    def synthetic_inputs(self, batch: int, generator: torch.Generator) -> Inputs:
        """Inputs shaped like the example input with batch ``batch``, from ``generator``."""
        out = []
        for k, x in enumerate(self.example_inputs):
            shape = (batch, *x.shape[1:])
            if x.is_floating_point():
                out.append(torch.randn(shape, generator=generator, dtype=x.dtype))
            else:
                high = (self.int_high[k] if k < len(self.int_high) and self.int_high[k]
                        else int(x.max().item()) + 1)
                out.append(torch.randint(0, max(high, 1), shape, generator=generator,
                                         dtype=x.dtype))
        return tuple(out)


def _parse_options(text: str, where: str) -> dict[str, Any]:
    opts: dict[str, Any] = {}
    if not text:
        return opts
    for item in _top_level_items(text):
        if "=" not in item:
            raise UsageError(f"model option {item!r} in {where!r} must be key=value, "
                             "e.g. outcore:resnet_k:depth=110")
        key, value = item.split("=", 1)
        try:
            opts[key.strip()] = ast.literal_eval(value.strip())
        except (ValueError, SyntaxError):
            low = value.strip().lower()
            opts[key.strip()] = {"true": True, "false": False}.get(low, value.strip())
    return opts


def _top_level_items(text: str) -> list[str]:
    """``text`` split at commas outside brackets: ``depths=(1,1),heads=2`` has two items."""
    items, depth, start = [], 0, 0
    for k, ch in enumerate(text):
        depth += ch in "([{"
        depth -= ch in ")]}"
        if ch == "," and depth == 0:
            items.append(text[start:k])
            start = k + 1
    items.append(text[start:])
    return items


def _check_options(fn: Callable[..., Any], opts: dict[str, Any], label: str,
                   extra: tuple[str, ...] = ()) -> dict[str, Any]:
    params = inspect.signature(fn).parameters
    accepts_any = any(p.kind == p.VAR_KEYWORD for p in params.values())
    for key in opts:
        if key not in params and key not in extra and not accepts_any:
            known = ", ".join(list(params) + list(extra))
            raise UsageError(f"{label} has no option {key!r}; its options are: {known}")
    return {k: v for k, v in opts.items() if k in params or (accepts_any and k not in extra)}


def _batch_and_shape(input_shape: tuple[int, ...] | None, batch_size: int | None,
                     default_batch: int) -> tuple[int, tuple[int, ...] | None]:
    if input_shape is not None:
        return (batch_size or input_shape[0]), input_shape
    return (batch_size or default_batch), None


def resolve_model(spec: str, *, input_shape: tuple[int, ...] | None = None,
                  batch_size: int | None = None) -> ModelSpec:
    """Resolve a model name (see module docstring) into a :class:`ModelSpec`.

    Args:
        spec: the model name.
        input_shape: full example input shape (batch first); overrides the model's default.
        batch_size: batch of the example input (overrides the first dimension).
    """
    if not isinstance(spec, str) or not spec.strip():
        raise ModelError("no model given: name it torchvision:<builder>, outcore:<zoo model>, "
                         "hf:<model type>, timm:<name> or path/to/file.py:function")
    spec = spec.strip()
    kind, _, rest = spec.partition(":")
    if kind == "torchvision":
        return _torchvision(spec, rest, input_shape, batch_size)
    if kind == "outcore":
        return _zoo(spec, rest, input_shape, batch_size)
    if kind == "hf":
        from outcore.zoo.ecosystem import hf_model
        return ModelSpec(spec, **hf_model(spec, rest, _parse_options,
                                          batch_size or (input_shape[0] if input_shape else None),
                                          input_shape))
    if kind == "timm":
        from outcore.zoo.ecosystem import timm_model
        return ModelSpec(spec, **timm_model(spec, rest, _parse_options, batch_size, input_shape))
    if ".py" in spec:
        return _from_file(spec, input_shape, batch_size)
    raise ModelError(f"unknown model {spec!r}: name it torchvision:<builder> (e.g. "
                     "torchvision:resnet50), outcore:<zoo model> (one of "
                     f"{', '.join(zoo_names())}), hf:<model type> (e.g. hf:gpt2), "
                     "timm:<name> (e.g. timm:resnet18) or path/to/file.py:function")


def _zoo(spec: str, rest: str, input_shape: tuple[int, ...] | None,
         batch_size: int | None) -> ModelSpec:
    name, _, opt_text = rest.partition(":")
    entry = ZOO.get(name)
    if entry is None:
        close = difflib.get_close_matches(name, ZOO, n=1)
        hint = f" (did you mean outcore:{close[0]}?)" if close else ""
        raise ModelError(f"no zoo model {name!r}{hint}; the zoo has: {', '.join(zoo_names())}")
    opts = _parse_options(opt_text, spec)
    kwargs = _check_options(entry.builder, opts, f"outcore:{name}", extra=("image_size",))
    batch, shape = _batch_and_shape(input_shape, batch_size, 2)

    def build() -> nn.Module:
        try:
            return entry.builder(**kwargs)
        except (ValueError, TypeError) as e:
            raise ModelError(f"cannot build outcore:{name}: {e}") from e

    probe(build)  # fail early on bad options
    if shape is not None:
        default = entry.make_input(opts, 1)
        if len(default) != 1:
            raise UsageError(f"outcore:{name} takes {len(default)} inputs; --input-shape "
                             "describes only one: use the default input")
        x0 = default[0]
        example: Inputs = ((torch.randn((batch, *shape[1:])),) if x0.is_floating_point()
                           else (torch.randint(0, int(opts.get("vocab", 256)),
                                               (batch, *shape[1:])),))
    else:
        example = entry.make_input(opts, batch)
    high = tuple(None if x.is_floating_point() else int(opts.get("vocab", 256)) for x in example)
    return ModelSpec(spec, build, example, high)


def _torchvision(spec: str, rest: str, input_shape: tuple[int, ...] | None,
                 batch_size: int | None) -> ModelSpec:
    import torchvision

    name, _, opt_text = rest.partition(":")
    names = torchvision.models.list_models(module=torchvision.models)
    if name not in names:
        every = torchvision.models.list_models()
        if name in every:
            raise ModelError(f"torchvision:{name} is not a classification model; outcore "
                             "builds torchvision classifiers (e.g. torchvision:resnet50)")
        close = difflib.get_close_matches(name, names, n=3)
        hint = f"; did you mean {', '.join('torchvision:' + c for c in close)}?" if close else ""
        raise ModelError(f"torchvision has no classification builder {name!r}{hint}")
    builder = torchvision.models.get_model_builder(name)
    opts = _parse_options(opt_text, spec)
    opts.pop("weights", None)
    if name.startswith("inception") or name == "googlenet":
        opts.setdefault("aux_logits", False)
        opts.setdefault("init_weights", True)

    def build() -> nn.Module:
        try:
            return builder(weights=None, **opts)
        except TypeError as e:
            raise ModelError(f"cannot build torchvision:{name} with {opts}: {e}") from e

    probe(build)
    batch, shape = _batch_and_shape(input_shape, batch_size, 1)
    if shape is None:
        size = _TV_SIZES.get(name, 224)
        shape = (batch, 3, size, size)
    return ModelSpec(spec, build, (torch.randn((batch, *shape[1:])),), (None,))


def _from_file(spec: str, input_shape: tuple[int, ...] | None,
               batch_size: int | None) -> ModelSpec:
    path_text, sep, fn_name = spec.rpartition(":")
    if not sep or not path_text.endswith(".py"):
        path_text, fn_name = spec, ""
    path = Path(path_text)
    if not path.is_file():
        raise ModelError(f"model file {path_text!r} does not exist")
    if not fn_name:
        raise ModelError(f"name the function that returns the model: {path_text}:<function>")
    mod_name = f"outcore_user_{abs(hash(str(path.resolve())))}"
    module = sys.modules.get(mod_name)
    if module is None:
        loader_spec = importlib.util.spec_from_file_location(mod_name, path)
        if loader_spec is None or loader_spec.loader is None:
            raise ModelError(f"cannot import {path_text}")
        module = importlib.util.module_from_spec(loader_spec)
        try:
            loader_spec.loader.exec_module(module)
        except Exception as e:  # the user's code: report any failure as one line
            raise ModelError(f"importing {path_text} failed: {type(e).__name__}: {e}") from e
        sys.modules[mod_name] = module
    fn = getattr(module, fn_name, None)
    if not callable(fn):
        defined = [n for n, v in vars(module).items() if callable(v) and not n.startswith("_")
                   and getattr(v, "__module__", None) == mod_name]
        raise ModelError(f"{path_text} has no function {fn_name!r}; it defines: "
                         f"{', '.join(defined) or 'no functions'}")

    def call() -> tuple[nn.Module, Any]:
        try:
            result = fn()
        except Exception as e:
            raise ModelError(f"{spec} raised {type(e).__name__}: {e}") from e
        example = None
        if isinstance(result, tuple) and len(result) == 2 and isinstance(result[0], nn.Module):
            result, example = result
        if not isinstance(result, nn.Module):
            raise ModelError(f"{spec} returned {type(result).__name__}; it must return a "
                             "torch.nn.Module or a (module, example_input) pair")
        return result, example

    try:  # the example, without the weights where the function can run so
        with parameters_on_meta():
            _, example = call()
    except Exception:
        _, example = call()
    high: tuple[int | None, ...] = ()
    if example is not None:
        example_inputs = example if isinstance(example, tuple) else (example,)
        if not all(isinstance(x, torch.Tensor) for x in example_inputs):
            raise ModelError(f"{spec}: the example input must be a tensor or a tuple of tensors")
        # the token range comes from the user's example, before any resizing
        high = tuple(None if x.is_floating_point() else _token_bound(x) for x in example_inputs)
        if input_shape is not None or batch_size is not None:
            if input_shape is not None and len(example_inputs) != 1:
                raise UsageError(f"{spec} takes {len(example_inputs)} inputs; --input-shape "
                                 "describes one")
            b = batch_size or (input_shape[0] if input_shape else example_inputs[0].shape[0])
            example_inputs = tuple(_resize(x, b, input_shape, h)
                                   for x, h in zip(example_inputs, high))
    elif input_shape is not None:
        b = batch_size or input_shape[0]
        example_inputs = (torch.randn((b, *input_shape[1:]), generator=_seeded()),)
        high = (None,)
    else:
        raise UsageError(f"{spec} returns no example input: give --input-shape "
                         "(e.g. 8x3x224x224) or return (model, example_input)")
    return ModelSpec(spec, lambda: call()[0], tuple(example_inputs), high)


def _seeded() -> torch.Generator:
    """Example inputs are drawn from a fixed seed: the same command gives the same run."""
    return torch.Generator().manual_seed(0)


def _token_bound(x: torch.Tensor) -> int:
    """Exclusive upper bound of an integer example input's values (its token range)."""
    return int(x.max().item()) + 1 if x.numel() else 1


def _resize(x: torch.Tensor, batch: int, shape: tuple[int, ...] | None,
            high: int | None) -> torch.Tensor:
    new = (batch, *(shape[1:] if shape else x.shape[1:]))
    if x.is_floating_point():
        return torch.randn(new, dtype=x.dtype, generator=_seeded())
    return torch.randint(0, high or _token_bound(x), new, dtype=x.dtype, generator=_seeded())
