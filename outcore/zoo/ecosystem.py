"""Models from the ecosystem, unmodified: ``hf:<model type>[:opts]`` and ``timm:<name>[:opts]``.

``hf:gpt2:hidden_size=64,num_hidden_layers=2`` builds a randomly initialised ``transformers``
model from ``AutoConfig.for_model`` (offline: no download), ``timm:resnet18:image_size=64``
calls ``timm.create_model(..., pretrained=False)``. Both libraries are optional extras
(``pip install outcore[models]``).

Example inputs are drawn from a seeded generator; token ids lie below the model's vocabulary
(``config.vocab_size``). The *task* (what the targets are) is inferred from the model, or chosen
with ``task=``: ``causal_lm`` (targets: the input shifted by one), ``masked_lm`` (15 % of the
tokens masked, targets only there), ``classification`` (one class per example) or
``regression``; see :mod:`outcore.runtime.data`.
"""

from __future__ import annotations

import difflib
import logging
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from outcore.config import TASKS
from outcore.errors import ModelError, UsageError
from outcore.zoo.weightless import probe

log = logging.getLogger(__name__)

# Tiny defaults: the ecosystem's sizes are for GPUs; these train in seconds on one core.
_HF_TINY = {"hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 2,
            "intermediate_size": 128, "vocab_size": 512, "max_position_embeddings": 128}
_HF_TYPE_TINY: dict[str, dict[str, Any]] = {
    "t5": {"d_ff": 128, "d_kv": 32, "num_decoder_layers": 2},
    "llama": {"num_key_value_heads": 2}, "mistral": {"num_key_value_heads": 2},
    "qwen2": {"num_key_value_heads": 2}, "gpt2": {"n_inner": 128},
    # (its default config is EfficientNet-B7's: 600 pixels, 64 M parameters; B0's scaling)
    "efficientnet": {"width_coefficient": 1.0, "depth_coefficient": 1.0, "hidden_dim": 1280},
}
_OWN_OPTIONS = ("task", "seq", "dropout", "image_size", "output", "dtype")
_INPUT_SEED = 0


def _dtype(name: Any) -> torch.dtype:
    """``dtype=float64`` of a ``timm:`` name: weights and inputs in that precision (float64
    makes rounding negligible, e.g. to compare placements of an ill-conditioned model)."""
    choices = {"float32": torch.float32, "float64": torch.float64}
    if str(name) not in choices:
        raise UsageError(f"dtype={name} is not supported: choose {', '.join(choices)}")
    return choices[str(name)]


def with_task(model: str, task: str) -> str:
    """``model`` asked to train for ``task``: an ``hf:``/``timm:`` name gets the option
    ``task=`` (the model is built for it: a regression head, a masked-LM head); other names
    are returned as they are (their targets follow the run's task, see runtime.data)."""
    if task not in TASKS:
        raise UsageError(f"unknown task {task!r}: choose {', '.join(TASKS)}")
    kind, _, rest = model.partition(":")
    if kind not in ("hf", "timm") or not rest:
        return model
    name, _, opts = rest.partition(":")
    kept = [o for o in opts.split(",") if o and not o.strip().startswith("task=")]
    return f"{kind}:{name}:{','.join(kept + [f'task={task}'])}"


def _generator() -> torch.Generator:
    return torch.Generator().manual_seed(_INPUT_SEED)


def _split(rest: str) -> tuple[str, str]:
    name, _, opt_text = rest.partition(":")
    return name, opt_text


def _no_dropout(config: Any, p: float) -> None:
    for key in list(vars(config)):
        if ("dropout" in key or "pdrop" in key) and isinstance(getattr(config, key), float):
            setattr(config, key, p)


def hf_config(model_type: str, opts: dict[str, Any],
              check: Callable[[Any], None] | None = None, vision: bool = False) -> Any:
    """A small random-init ``transformers`` config (offline): the tiny sizes, in every part of
    a composite model (a language model beside a vision or audio encoder) too, unless ``opts``
    give them. A model type that refuses a tiny size (its config validates the layer count
    against its own layer pattern, its sequence length cannot be set) keeps its own for that
    size, with a log line; ``check(config)`` (building the model) counts as a refusal too."""
    try:
        from transformers import AutoConfig
    except ImportError as e:
        raise ModelError("hf: models need transformers: pip install 'outcore[models]'") from e
    user = {k: v for k, v in opts.items() if k not in _OWN_OPTIONS}
    try:
        base = AutoConfig.for_model(model_type)
    except ValueError as e:
        raise ModelError(f"transformers has no model type {model_type!r}: {e}") from None
    except Exception:  # noqa: BLE001 - a config that needs options the user gives
        base = None
    tiny = {**_HF_TINY, **_HF_TYPE_TINY.get(model_type, {})}
    if vision and base is not None:
        tiny = _vision_tiny(vars(base), tiny)
    tiny = _tiny_sizes(base, tiny, user)
    first: Exception | None = None
    for dropped in _TINY_FALLBACK:
        kwargs = {k: v for k, v in tiny.items() if k not in dropped}
        try:
            config = _made_config(model_type, {**kwargs, **user}, opts)
            if check is not None:
                check(config)
        except (ModelError, UsageError):
            raise
        except Exception as e:  # noqa: BLE001 - transformers raises many types for sizes
            first = first or e
            continue
        if dropped:
            kept = sorted(k for k in set(tiny) & set(dropped) if not k.startswith("(")) + \
                sorted(tiny.get(_AGREEING, {}) if _AGREEING in dropped else ()) + \
                sorted(f"{k} sizes" for k in tiny.get(_SUB_CONFIGS, {}) if _SUB_CONFIGS in dropped)
            log.info("hf:%s keeps its own %s (the tiny size was refused: %s)", model_type,
                     ", ".join(kept), str(first).strip().splitlines()[-1][:160])
        return config
    assert first is not None
    if isinstance(first, ValueError) and "Unrecognized model" in str(first):
        raise ModelError(f"transformers has no model type {model_type!r}: {first}") from None
    raise ModelError(f"cannot build hf:{model_type}: {type(first).__name__}: "
                     f"{str(first).strip().splitlines()[-1][:300]}") from first


def _vision_tiny(fields: dict[str, Any], tiny: dict[str, Any]) -> dict[str, Any]:
    """The tiny sizes for an image model's config (its attributes ``fields``): a stage list
    (ConvNeXt's, Swin's ``depths``) of one block each and narrow ``hidden_sizes``, no layer
    count beside it (it would cut the stages), sizes the config keeps per stage (LeViT's head
    counts) left as they are, and windows of 4 patches (a 32-pixel image has 8 x 8)."""
    out = {k: v for k, v in tiny.items() if not isinstance(fields.get(k), (list, tuple))}
    if isinstance(fields.get("depths"), (list, tuple)):
        out.pop("num_hidden_layers", None)
        out["depths"] = [1] * len(fields["depths"])
    if isinstance(fields.get("hidden_sizes"), (list, tuple)):
        out["hidden_sizes"] = [16 * 2 ** i for i in range(len(fields["hidden_sizes"]))]
    if isinstance(fields.get("window_size"), int) and fields["window_size"] > 4:
        out["window_size"] = 4
    return out


# the tiny sizes given up in turn when a model type refuses them (each step keeps the earlier)
_SUB_CONFIGS, _AGREEING = "(parts)", "(agreeing)"
_TINY_FALLBACK: tuple[frozenset[str], ...] = tuple(frozenset(s) for s in (
    (), (_AGREEING,), ("max_position_embeddings",), ("max_position_embeddings", _AGREEING),
    ("max_position_embeddings", _SUB_CONFIGS),
    ("max_position_embeddings", _SUB_CONFIGS, "num_hidden_layers"),
    ("max_position_embeddings", _SUB_CONFIGS, "num_hidden_layers", "intermediate_size"),
    ("max_position_embeddings", _SUB_CONFIGS, "num_hidden_layers", "intermediate_size",
     "num_attention_heads", "num_key_value_heads", "hidden_size", _AGREEING),
    ("max_position_embeddings", _SUB_CONFIGS, "num_hidden_layers", "intermediate_size",
     "num_attention_heads", "num_key_value_heads", "hidden_size", _AGREEING, "depths",
     "hidden_sizes", "window_size")))


def _tiny_sizes(base: Any, tiny: dict[str, Any], user: dict[str, Any]) -> dict[str, Any]:
    """The tiny sizes for a model type whose default config is ``base``, with the fields that
    must agree with them (:func:`_agreeing`, under the key :data:`_AGREEING`), and the same
    sizes for each part of a composite config (under :data:`_SUB_CONFIGS`; both expanded by
    :func:`_made_config`)."""
    out = dict(tiny)
    if base is None:
        return out
    sizes = {**out, **user}
    out[_AGREEING] = _agreeing(vars(base), sizes)
    parts = {}
    for name in getattr(type(base), "sub_configs", {}) or {}:
        sub = getattr(base, name, None)
        if name in user or sub is None or not hasattr(sub, "to_dict"):
            continue
        fields = vars(sub)
        part = {k: v for k, v in _HF_TINY.items() if k in fields}
        part.update(_agreeing(fields, dict(_HF_TINY)))
        if part:
            parts[name] = {**({"model_type": sub.model_type}
                              if getattr(sub, "model_type", "") else {}), **part}
    if parts:
        out[_SUB_CONFIGS] = parts
    return out


def _agreeing(fields: dict[str, Any], sizes: dict[str, Any]) -> dict[str, Any]:
    """Fields of a config (``fields``: its attributes) that must agree with the tiny
    ``sizes``: the width of a head (``head_dim``, XLNet's ``d_head``: a config keeping its own
    makes some models multiply mismatched widths; but not where it is latent attention's
    rotary width, ``qk_rope_head_dim``, as DeepSeek's and Youtu's are), key/value heads (a
    config without a count of its own leaves them None), experts per token where the default
    names none, an embedding as wide as the layers (SqueezeBERT), no layers sharing another's
    cache and per-layer embeddings of the tiny vocabulary (Gemma 3n)."""
    hidden, heads = sizes.get("hidden_size"), sizes.get("num_attention_heads")
    out: dict[str, Any] = {}
    if not isinstance(hidden, int) or not isinstance(heads, int):  # (an image model's per-stage)
        return out
    if hidden % heads == 0:
        out.update({k: hidden // heads for k in ("head_dim", "d_head") if k in fields})
    if "qk_rope_head_dim" in fields and fields.get("head_dim") == fields["qk_rope_head_dim"]:
        out.pop("head_dim", None)  # latent attention's: the rotary width (Youtu's rotations)
    if "num_key_value_heads" in fields:
        out["num_key_value_heads"] = heads
    if "embedding_size" in fields:
        out["embedding_size"] = hidden
    if "num_experts_per_tok" in fields and fields["num_experts_per_tok"] is None:
        out["num_experts_per_tok"] = 2  # a default without one routes to none (DeepSeek-V2)
    if "num_kv_shared_layers" in fields:
        out["num_kv_shared_layers"] = 0
    if "vocab_size_per_layer_input" in fields:
        out["vocab_size_per_layer_input"] = int(sizes["vocab_size"])
    return {k: v for k, v in out.items() if k not in sizes}


def _made_config(model_type: str, kwargs: dict[str, Any], opts: dict[str, Any]) -> Any:
    from transformers import AutoConfig

    kwargs = dict(kwargs)
    kwargs.update(kwargs.pop(_SUB_CONFIGS, {}))
    kwargs = {**kwargs.pop(_AGREEING, {}), **kwargs}
    # the full vocabulary's special token ids past the tiny one are fitted below
    # (_fit_token_ids): the config's warning about them while it is made is not the user's
    said = logging.getLogger("transformers.configuration_utils")
    said.addFilter(_token_id_warning)
    try:
        config = AutoConfig.for_model(model_type, **kwargs)
    finally:
        said.removeFilter(_token_id_warning)
    _no_cache(config)
    _fit_heads(config, opts)
    _fit_token_ids(config, opts, model_type)
    _no_dropout(config, float(opts.get("dropout", 0.0)))
    return config


def _no_cache(config: Any) -> None:
    """No key/value cache in the config or any part of a composite one (Gemma 3n's text
    model): a cache in the output is not a pytree, and training needs none."""
    config.use_cache = False
    for name in getattr(type(config), "sub_configs", {}) or {}:
        sub = getattr(config, name, None)
        if sub is not None and hasattr(sub, "use_cache"):
            sub.use_cache = False


def _fit_heads(config: Any, opts: dict[str, Any]) -> None:
    """Head options the tiny sizes break, made consistent unless given: key/value heads
    (Gemma, Qwen3, StableLM default to more than the tiny 2 query heads) at most the query
    heads and dividing them; GPT-J's and CodeGen's ``rotary_dim`` (default 64) at most the head
    width."""
    heads = getattr(config, "num_attention_heads", None)
    if not isinstance(heads, int) or heads < 1:
        return
    kv = getattr(config, "num_key_value_heads", None)
    if "num_key_value_heads" not in opts and isinstance(kv, int) and kv > 0 and heads % kv:
        config.num_key_value_heads = heads
    rotary = getattr(config, "rotary_dim", None)
    if not isinstance(rotary, int) or "rotary_dim" in opts:
        return
    try:  # a config with per-layer head widths refuses to name one (Gemma 4)
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    except Exception:  # noqa: BLE001
        return
    if rotary > head_dim:
        config.rotary_dim = head_dim


_TOKEN_IDS = ("pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id",
              "sep_token_id", "cls_token_id", "mask_token_id", "unk_token_id")


def _token_id_warning(record: logging.LogRecord) -> bool:
    return "within the vocabulary" not in record.getMessage()


def _fit_token_ids(config: Any, opts: dict[str, Any], model_type: str) -> None:
    """Special token ids of the full vocabulary (Marian pads with id 58100) past the tiny one
    (an embedding's ``padding_idx`` must lie inside it): the last ids of the tiny vocabulary,
    unless given. A masked-LM encoder without a padding id (ESM's and Funnel's defaults; their
    checkpoints have one) cannot run its own forward, which finds positions by comparing the
    tokens with it: it gets the last id too."""
    from transformers.models.auto import modeling_auto as ma

    vocab = getattr(config, "vocab_size", None)
    if not isinstance(vocab, int) or vocab < len(_TOKEN_IDS) + 1:
        return
    for j, key in enumerate(_TOKEN_IDS):
        value = getattr(config, key, None)
        if key not in opts and isinstance(value, int) and value >= vocab:
            setattr(config, key, vocab - 1 - j)
    if "pad_token_id" not in opts and model_type in ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES and \
            getattr(config, "pad_token_id", 0) is None:
        config.pad_token_id = vocab - 1


def hf_task(model_type: str, task: str | None) -> str:
    """The task of an ``hf:`` model: asked for, else causal LM, seq2seq LM or masked LM."""
    from transformers.models.auto import modeling_auto as ma

    if task is not None:
        if task not in TASKS:
            raise UsageError(f"unknown task {task!r}: choose {', '.join(TASKS)}")
        return task
    if model_type in ma.MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES:
        return "seq2seq_lm"
    if model_type in ma.MODEL_FOR_MASKED_LM_MAPPING_NAMES:  # BERT-style encoders
        return "masked_lm"
    if model_type in ma.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        return "causal_lm"
    if model_type not in ma.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES and \
            model_type not in ma.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES:
        raise ModelError(f"hf:{model_type} is not a language model, text classifier or image "
                         "classifier that transformers builds from its type alone; build it "
                         "in a file and name it path/to/file.py:function")
    return "classification"


def hf_images(model_type: str, task: str) -> bool:
    """Whether ``hf:<model_type>`` classifies images (ViT, ConvNeXt, Swin, ResNet, ...): an
    image classifier and no text one of that type, for a classification or regression task."""
    from transformers.models.auto import modeling_auto as ma

    return task in ("classification", "regression") and \
        model_type in ma.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES and \
        model_type not in ma.MODEL_FOR_SEQUENCE_CLASSIFICATION_MAPPING_NAMES


def _hf_builder(task: str, image_type: str | None = None) -> Callable[[Any], nn.Module]:
    """How to build a model of ``task`` from a config (``image_type``: the model type of an
    image classifier; where it has several classes, DeiT's with and without a teacher, the
    first)."""
    import transformers as tf

    if image_type is not None:
        from transformers.models.auto import modeling_auto as ma

        names = ma.MODEL_FOR_IMAGE_CLASSIFICATION_MAPPING_NAMES[image_type]
        name = names[0] if isinstance(names, (tuple, list)) else names
        return getattr(tf, name)._from_config
    auto = {"causal_lm": tf.AutoModelForCausalLM, "masked_lm": tf.AutoModelForMaskedLM,
            "seq2seq_lm": tf.AutoModelForSeq2SeqLM,
            "classification": tf.AutoModelForSequenceClassification,
            "regression": tf.AutoModelForSequenceClassification}[task]
    return auto.from_config


def hf_model(spec: str, rest: str, parse: Callable[[str, str], dict[str, Any]],
             batch_size: int | None, input_shape: tuple[int, ...] | None) -> dict[str, Any]:
    """Resolve ``hf:<model type>[:opts]`` into the fields of a ``ModelSpec``: token ids for a
    language model (``input_shape``: batch x sequence), images for an image classifier
    (batch x channels x height x width, 32 x 32 by default or ``image_size=``)."""
    model_type, opt_text = _split(rest)
    opts = parse(opt_text, spec)
    if opts.get("task") == "regression":
        opts.setdefault("num_labels", 1)
    folder = local_folder(model_type)
    if folder is not None:  # a checkpoint on disk: its config, and its weights to start from
        config = folder_config(folder, opts)
        model_type = config.model_type
    task = hf_task(model_type, opts.get("task"))
    images = hf_images(model_type, task)
    make = _hf_builder(task, model_type if images else None)
    if images and folder is None:
        return _hf_image_model(spec, model_type, opts, make, task, batch_size, input_shape)
    if folder is None:
        config = hf_config(model_type, opts, check=lambda c: probe(lambda: make(c)))
    if task == "regression":
        config.problem_type = "regression"
    seq_from_shape = input_shape[1] if input_shape is not None and len(input_shape) > 1 \
        else None
    seq = int(opts.get("seq", seq_from_shape or 16))
    _fit_axial_positions(config, seq, opts)

    # the weights in another precision (the inputs are token ids)
    build = _builder(spec, task, make, config, _dtype(opts["dtype"]) if "dtype" in opts else None)
    probe(build)
    batch = batch_size or 2
    vocab = int(config.vocab_size)
    gen = _generator()
    ids = torch.randint(0, vocab, (batch, seq), generator=gen)
    inputs: tuple[torch.Tensor, ...] = (ids,)
    high: tuple[int | None, ...] = (vocab,)
    if task == "seq2seq_lm":  # forward(input_ids, attention_mask, decoder_input_ids)
        inputs = (ids, torch.ones_like(ids), torch.randint(0, vocab, (batch, seq), generator=gen))
        high = (vocab, 1, vocab)
    mask_id = getattr(config, "mask_token_id", None)
    if mask_id is None or not 0 <= int(mask_id) < vocab:
        mask_id = vocab - 1
    return {"build": build, "example_inputs": inputs, "int_high": high, "task": task,
            "task_options": {"mask_token_id": int(mask_id)},
            "weights": str(folder) if folder is not None else None}


def _fit_axial_positions(config: Any, seq: int, opts: dict[str, Any]) -> None:
    """Axial position embeddings (Reformer's) as a grid of ``seq`` positions: a model in
    training takes only sequences as long as its grid (64 x 64 by default, for a sequence of
    16 tokens). Left as given where ``axial_pos_shape`` is an option."""
    shape = getattr(config, "axial_pos_shape", None)
    if not getattr(config, "axial_pos_embds", False) or not shape or "axial_pos_shape" in opts:
        return
    rows = max(d for d in range(1, int(seq ** 0.5) + 1) if seq % d == 0)
    config.axial_pos_shape = (rows, seq // rows) if len(shape) == 2 else shape


def _builder(spec: str, task: str, make: Callable[[Any], nn.Module], config: Any,
             dtype: torch.dtype | None = None) -> Callable[[], nn.Module]:
    """Builds ``spec``'s model from ``config`` (its weights in ``dtype`` where given); a
    config transformers refuses for ``task`` is said in one line."""
    def build() -> nn.Module:
        try:
            model = make(config)
        except (ValueError, TypeError, KeyError) as e:
            raise ModelError(f"cannot build {spec} for {task}: {e}") from e
        return model if dtype is None else model.to(dtype)
    return build


def _hf_image_model(spec: str, model_type: str, opts: dict[str, Any],
                    make: Callable[[Any], nn.Module], task: str, batch_size: int | None,
                    input_shape: tuple[int, ...] | None) -> dict[str, Any]:
    """The ``ModelSpec`` fields of a Hugging Face image classifier: the tiny sizes, its
    ``image_size`` set to the images it is given, random images as the example batch."""
    if input_shape is not None and len(input_shape) != 4:
        raise UsageError(f"{spec} classifies images: give --input-shape as "
                         f"BATCHxCHANNELSxHEIGHTxWIDTH, not {'x'.join(map(str, input_shape))}")
    config = hf_config(model_type, opts, check=lambda c: probe(lambda: make(c)), vision=True)
    side = int(opts.get("image_size", _smallest_side(config)))
    height, width = (int(input_shape[2]), int(input_shape[3])) if input_shape else (side, side)
    own = getattr(config, "image_size", None)
    if own is not None:  # position tables and the like are sized from it (as it is given)
        config.image_size = type(own)((height, width)) if isinstance(own, (list, tuple)) \
            else height if height == width else (height, width)
    if task == "regression":
        config.problem_type = "regression"

    build = _builder(spec, task, make, config)
    probe(build)
    channels = int(input_shape[1]) if input_shape else int(getattr(config, "num_channels", 3))
    batch = batch_size or (input_shape[0] if input_shape else 2)
    x = torch.randn((batch, channels, height, width), generator=_generator())
    return {"build": build, "example_inputs": (x,), "int_high": (None,), "task": task,
            "task_options": {}, "weights": None}


def _smallest_side(config: Any) -> int:
    """The default image side of an ``hf:`` image classifier: 32 pixels, or as many as its
    last stage needs to hold one whole attention window (Swin's windows cannot be cut)."""
    window, patch = getattr(config, "window_size", None), getattr(config, "patch_size", None)
    depths = getattr(config, "depths", None)
    if isinstance(window, int) and isinstance(patch, int) and isinstance(depths, (list, tuple)):
        return max(32, window * patch * 2 ** (len(depths) - 1))
    return 32


def local_folder(name: str) -> Path | None:
    """``name`` as a local Hugging Face checkpoint folder (a path holding ``config.json``), or
    None for a model type. A path without one is refused."""
    if "/" not in name and not name.startswith(".") and not Path(name).is_dir():
        return None
    folder = Path(name).expanduser()
    if not (folder / "config.json").is_file():
        raise ModelError(f"hf:{name}: no config.json in that folder (a local Hugging Face "
                         "checkpoint: config.json and *.safetensors)")
    if not list(folder.glob("*.safetensors")):
        raise ModelError(f"hf:{name}: no *.safetensors in that folder (save it with "
                         "save_pretrained(folder), which writes them)")
    return folder


def folder_config(folder: Path, opts: dict[str, Any]) -> Any:
    """The config of a local checkpoint, read offline; ``opts`` as for a model type (except
    sizes, which are the checkpoint's)."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(str(folder), local_files_only=True)
    _no_cache(config)
    if "dropout" in opts:
        _no_dropout(config, float(opts["dropout"]))
    return config


def timm_model(spec: str, rest: str, parse: Callable[[str, str], dict[str, Any]],
               batch_size: int | None, input_shape: tuple[int, ...] | None) -> dict[str, Any]:
    """Resolve ``timm:<name>[:opts]`` into the fields of a ``ModelSpec``."""
    try:
        import timm
    except ImportError as e:
        raise ModelError("timm: models need timm: pip install 'outcore[models]'") from e
    name, opt_text = _split(rest)
    if name not in timm.list_models():
        close = difflib.get_close_matches(name, timm.list_models(), n=3)
        hint = f"; did you mean {', '.join('timm:' + c for c in close)}?" if close else ""
        raise ModelError(f"timm has no model {name!r}{hint}")
    opts = parse(opt_text, spec)
    task = opts.pop("task", "classification")
    if task not in ("classification", "regression"):
        raise UsageError(f"timm:{name} is an image model: task is classification or regression")
    size = opts.pop("image_size", None)
    dtype = _dtype(opts.pop("dtype", "float32"))
    opts.setdefault("num_classes", 1 if task == "regression" else 10)
    kwargs = {k: v for k, v in opts.items() if k not in _OWN_OPTIONS}
    if size is not None and "img_size" not in kwargs:
        kwargs["img_size"] = int(size)

    def create(kw: dict[str, Any]) -> nn.Module:
        return timm.create_model(name, pretrained=False, **kw).to(dtype)

    try:
        probe(lambda: create(kwargs))
    except TypeError:
        if "img_size" not in opts and "img_size" in kwargs:
            kwargs.pop("img_size")  # a convolutional model: any input size
            probe(lambda: create(kwargs))
        else:
            raise
    except Exception as e:  # timm raises many types for bad options
        raise ModelError(f"cannot build {spec}: {type(e).__name__}: {e}") from e

    def build() -> nn.Module:
        return create(kwargs)

    cfg = timm.models.get_pretrained_cfg(name)
    default = tuple(getattr(cfg, "input_size", (3, 224, 224)) if cfg else (3, 224, 224))
    chw = tuple(input_shape[1:]) if input_shape else \
        ((default[0], int(size), int(size)) if size is not None else default)
    batch = batch_size or (input_shape[0] if input_shape else 2)
    x = torch.randn((batch, *chw), generator=_generator()).to(dtype)
    return {"build": build, "example_inputs": (x,), "int_high": (None,), "task": task,
            "task_options": {}}
