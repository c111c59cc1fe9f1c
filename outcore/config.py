"""The run configuration: every option of ``outcore train`` (and the options ``outcore plan`` and
``outcore graph`` share with it), declared once.

A :class:`TrainConfig` is a tree of frozen dataclasses, one per concern: what to train and how
its graph is captured and costed (``cfg.graph``: :class:`GraphOptions`), on what data
(``cfg.dataset``: :class:`DataOptions`), with which optimizer (``cfg.optim``:
:class:`OptimizerOptions`), planned how (``cfg.planning``: :class:`PlanOptions`), run and written
where (``cfg.run``: :class:`RunOptions`), plus what the launcher decides for its workers
(``cfg.worker``: :class:`WorkerOptions`, never set by users). From the fields' metadata come

* the command line: :func:`add_options` adds each field a command uses as ``--field-name``
  (with its help, type, choices and default), and :func:`from_args` reads them back;
* the Python API: ``outcore.train(model, devices, **options)`` takes the same names, with
  ``_`` for ``-`` (:func:`from_options`), and ``help(outcore.train)`` lists them;
* the workers' configuration: the launcher sends the resolved tree to every worker.

Adding an option to ``outcore train`` is one field here. No torch.
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import json
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from outcore.errors import UsageError
from outcore.units import PRECISIONS, parse_bytes, parse_precision, parse_shape

__all__ = ["DataOptions", "GraphOptions", "OptimizerOptions", "PlanOptions", "RunOptions",
           "SECTIONS", "TASKS", "TrainConfig", "WorkerOptions", "add_options", "degree",
           "differences", "from_args", "from_options", "option_names", "options_doc"]

COMMANDS = ("train", "plan", "graph")
TASKS = ("classification", "regression", "causal_lm", "masked_lm", "seq2seq_lm")


def _positive_int(text: Any) -> int:
    try:
        value = int(text)
    except (TypeError, ValueError):
        raise UsageError(f"{text!r} is not a whole number") from None
    if value < 1 or (isinstance(text, float) and text != value):
        raise UsageError(f"must be a whole number of at least 1, got {text!r}")
    return value


def _count(text: Any) -> int:
    value = _positive_int(text) if str(text) != "0" else 0
    return value


def _degree(text: Any) -> int | str:
    """A positive degree or ``auto``."""
    return "auto" if str(text) == "auto" else _positive_int(text)


def _shape(text: Any) -> tuple[int, ...]:
    if isinstance(text, (tuple, list)):
        return tuple(_positive_int(x) for x in text)
    return parse_shape(str(text))


def _task(text: Any) -> str:
    value = str(text).replace("-", "_")
    if value not in TASKS:
        raise UsageError(f"unknown task {text!r}: use one of {', '.join(TASKS)}")
    return value


def _memory(text: Any) -> str | float:
    parse_bytes(text)  # checked here, kept as given (plans and reports print it)
    return text


def _text(text: Any) -> str:
    return str(text)


def _costs(text: Any) -> str:
    value = str(text)
    kind = value.partition(":")[0]
    if kind not in ("profile", "profile-by-layer", "estimate", "none"):
        raise UsageError(f"unknown costs {text!r}: use profile (time each layer on this "
                         "machine), profile-by-layer (one layer at a time), estimate:DEVICE "
                         "(analytical, e.g. estimate:a100) or none")
    return value


# what a run can train on: --data synthetic, or KIND:PATH for the other kinds
DATA_KINDS = {"synthetic": "seeded random batches", "imagefolder": "a folder of class folders",
              "text": "a text file, byte-level tokens", "tiles": "huge images read tile by tile"}


def data_source(text: Any) -> tuple[str, str]:
    """``(kind, path)`` of a ``--data`` value (``("synthetic", "")`` for synthetic data)."""
    kind, _, path = str(text).partition(":")
    if kind == "synthetic" and not path:
        return kind, ""
    if kind not in DATA_KINDS or kind == "synthetic" or not path:
        raise UsageError(f"unknown data {text!r}: use synthetic, imagefolder:PATH, text:FILE "
                         "or tiles:PATH")
    return kind, path


def _data(text: Any) -> str:
    data_source(text)
    return str(text)


def option(default: Any, help: str, *, commands: tuple[str, ...] = ("train",),
           parse: Callable[[Any], Any] = _text, choices: tuple[str, ...] | None = None,
           metavar: str | None = None, flag: bool = False, many: bool = False,
           defaults: Mapping[str, Any] | None = None) -> Any:
    """A configuration field and its metadata.

    Args:
        default: the value when not given.
        help: one or two sentences for ``--help`` and the API's docstring.
        commands: the commands that take it (``train``, ``plan``, ``graph``).
        parse: turns a command-line string (or an API value) into the field's value; raises
            :class:`UsageError` naming what is wrong.
        choices: the allowed values (the command line lists them).
        flag: a switch (``--resume``), True when given.
        many: repeatable (``--leaf A --leaf B``), a tuple.
        defaults: per command, a default other than ``default`` (``costs``: ``profile`` for
            ``train``, ``estimate:cpu`` for ``plan``).
    """
    meta = {"help": help, "commands": commands, "parse": parse, "choices": choices,
            "metavar": metavar, "flag": flag, "many": many, "defaults": dict(defaults or {})}
    return field(default=default, metadata={"option": meta})


@dataclass(frozen=True, kw_only=True)
class GraphOptions:
    """What to train and how its graph is captured and costed."""

    model: str = option(
        "", "the model: torchvision:<builder>, outcore:<zoo model>[:options], timm:<name>, "
        "hf:<Hugging Face model type>[:options], or path/to/file.py:function",
        commands=())  # a positional argument of each command
    input_shape: tuple[int, ...] | None = option(
        None, "example input shape, batch first, e.g. 8x3x224x224 (default: the model's own)",
        commands=COMMANDS, parse=_shape, metavar="SHAPE")
    batch_size: int | None = option(
        None, "samples per training step, the global batch (default: 8 for train, the "
        "model's own otherwise; 16 for the default job)", commands=COMMANDS,
        parse=_positive_int, metavar="N")
    task: str | None = option(
        None, "what the targets are: classification, regression (MSE), causal_lm (each "
        "token predicts the next), masked_lm (15%% of tokens masked), seq2seq_lm "
        "(encoder-decoder); default: from the model and its output. hf: and timm: models are "
        "built with its head", commands=COMMANDS, parse=_task, choices=TASKS)
    leaf: tuple[str, ...] = option(
        (), "keep this module as one layer of the graph (not traced inside): a module path "
        "(layer1.0) or a module class name (BasicBlock: every module of that type); "
        "repeatable. For modules torch.fx cannot trace, or to plan on coarser layers",
        commands=COMMANDS, many=True, metavar="MODULE")
    weights: str | None = option(
        None, "start from these weights: a .safetensors file or a torch state dict (torch.save), "
        "tensors matched to the model's parameters by name; each rank reads only its own "
        "(default: the model's own random initialisation with --seed)", metavar="FILE")
    costs: str = option(
        "profile", "how layers are costed: profile (time each layer on this machine; one "
        "layer at a time when the whole model's training state does not fit), "
        "profile-by-layer (always one layer at a time on the device, identical layers timed "
        "once, no weights built), estimate:DEVICE (analytical for a preset: cpu, v100, a100, "
        "h100, mi250x) or none (default: profile for train, estimate:cpu for plan, none for "
        "graph)",
        commands=COMMANDS, parse=_costs, metavar="profile|profile-by-layer|estimate:DEVICE|none",
        defaults={"plan": "estimate:cpu", "graph": "none"})
    precision: str = option(
        "32", "the numbers computed in: 32 (float32), bf16-mixed or 16-mixed (autocast to "
        "bfloat16 / float16 with float32 master weights, gradients and optimizer state; "
        "16-mixed scales the loss). The graph is captured and costed in it, so activation "
        "bytes, messages and the memory model follow it",
        commands=COMMANDS, parse=parse_precision, choices=PRECISIONS,
        metavar="32|bf16-mixed|16-mixed")


@dataclass(frozen=True, kw_only=True)
class DataOptions:
    """What the model trains on."""

    data: str = option(
        "synthetic", "synthetic (seeded random batches), imagefolder:PATH, text:FILE "
        "(byte-level tokens) or tiles:PATH (huge images read tile by tile)", parse=_data)
    epochs: int | None = option(
        None, "epochs over an image folder instead of --steps", parse=_positive_int,
        metavar="N")


@dataclass(frozen=True, kw_only=True)
class OptimizerOptions:
    """How parameters are updated (the plan's memory model follows the optimizer)."""

    optimizer: str = option(
        "adam", "adam, adamw or sgd (with --momentum, 0.9 by default; the memory model "
        "counts 4, 4 and 3 copies of the parameters, 2 for SGD with --momentum 0)",
        commands=("train", "plan"),
        choices=("adam", "adamw", "sgd"))
    lr: float = option(1e-3, "learning rate", parse=float)
    momentum: float = option(0.9, "SGD momentum (0: plain SGD, one copy of the parameters "
                             "less in memory)", parse=float, commands=("train", "plan"))
    weight_decay: float = option(0.0, "weight decay", parse=float)
    lr_schedule: str = option("none", "learning-rate schedule: none, cosine, or step (x0.1 "
                              "every third of the run)", choices=("none", "cosine", "step"))

    @property
    def planned(self) -> str:
        """The optimizer as the plan's memory and time models name it: SGD with momentum keeps
        a momentum buffer (3 copies of the parameters), plain SGD none (2)."""
        if self.optimizer == "sgd" and self.momentum:
            return "sgd-momentum"
        return self.optimizer


@dataclass(frozen=True, kw_only=True)
class PlanOptions:
    """How the model is spread over devices."""

    devices: int = option(
        1, "devices (one worker process each); the default job uses 4",
        commands=("train", "plan"), parse=_positive_int, metavar="K")
    memory: str | float | None = option(
        None, "memory per device the plan must fit (e.g. 16GiB; default: unlimited)",
        commands=("train", "plan"), parse=_memory, metavar="SIZE")
    strategy: str = option(
        "auto", "placer: auto (every placer, the fastest plan by simulation wins) or one named "
        "by outcore plan --help", commands=("train", "plan"))
    layout: str | None = option(
        None, "auto: the search chooses data parallelism, GEMS replicas, tensor parallelism, "
        "sharding and the micro-batches; given: they are as the options say (default: auto "
        "for train when no layout option is given, given for plan)",
        commands=("train", "plan"), choices=("given", "auto"))
    parallel: str | None = option(
        None, "mp (one replica split over the devices), mast (GEMS: a second replica in the "
        "opposite direction on the same devices), master (GEMS: --replicas replicas); "
        "default mp", commands=("train", "plan"), choices=("mp", "mast", "master"))
    replicas: int | None = option(
        None, "master: replicas (default: the fastest that fits)", commands=("train", "plan"),
        parse=_positive_int, metavar="N")
    dp: int | None = option(
        None, "data-parallel copies of the model-parallel group (divides --devices; default 1)",
        commands=("train", "plan"), parse=_positive_int, metavar="N")
    tp: int | str | None = option(
        None, "tensor-parallel ranks per device slot (Megatron pairs of Linear and Embedding "
        "layers found in the graph), or auto: the fastest of 1, 2, 4, 8 that fits (default 1, "
        "or the layout search's choice); see docs/tensor.md", commands=("train", "plan"),
        parse=_degree, metavar="N|auto")
    shard: int | str | None = option(
        None, "sharded data parallelism (FSDP / ZeRO-3): N of the --dp copies of each slot "
        "hold 1/N of its parameter state each; N divides --dp; auto: the fastest that fits "
        "(default: none, or the layout search's choice)", commands=("train", "plan"),
        parse=_degree, metavar="N|auto")
    sp: int = option(
        1, "spatial parallelism (MPI4DL SP + LP): the layers before the join run on --sp image "
        "tiles, one rank each, with halo exchange; --devices counts them; see docs/spatial.md",
        commands=("train", "plan"), parse=_positive_int, metavar="N")
    sp_join: str | None = option(
        None, "the last node run on tiles (default: the planner's choice)",
        commands=("train", "plan"), metavar="NODE")
    sp_grid: str | None = option(
        None, "tile grid, ROWSxCOLS (default: --sp tiles over the height)",
        commands=("train", "plan"), metavar="ROWSxCOLS")
    microbatches: int | str | None = option(
        None, "micro-batches per step and model copy (of the whole batch for a batch-norm "
        "model whose layout the search chooses: --batch-stats), or auto: the fewest that fit, "
        "more when they are faster (default: auto for train and for plan --layout auto, else 1 "
        "for plan; 4 for the default job)",
        commands=("train", "plan"), parse=_degree, metavar="N|auto")
    schedule: str = option(
        "auto", "pipeline schedule: 1f1b (fewest activations held), gpipe (every forward, then "
        "every backward), or auto (the faster of the two on the best placement; 1f1b on a "
        "tie)", commands=("train", "plan"), choices=("auto", "gpipe", "1f1b"))
    memory_policy: str = option(
        "auto", "when a placement does not fit --memory: auto (per piece, the cheapest of "
        "activation checkpointing and CPU offload that fits), none, checkpoint or offload "
        "(on a CPU only checkpointing saves memory)", commands=("train", "plan"),
        choices=("auto", "none", "checkpoint", "offload"))
    batch_stats: str = option(
        "global", "batch-norm statistics when the search chooses the layout: global (over each "
        "of the --microbatches micro-batches of the whole batch, as on one device: model "
        "copies take whole micro-batches) or per-copy (--microbatches counts per model copy, "
        "as DDP does)", commands=("train", "plan"), choices=("global", "per-copy"))
    plan: str | None = option(
        None, "a saved plan (outcore plan -o) to train instead of planning", metavar="PLAN.json")
    schedule_file: str | None = option(
        None, "run this schedule's action lists (outcore plan --schedule-out; checked against "
        "the plan) instead of the plan's own", metavar="FILE.json")
    bandwidth: str = option("16GB/s", "link bandwidth between devices", commands=("plan",),
                            metavar="RATE")
    latency: str = option("25us", "link latency between devices", commands=("plan",),
                          metavar="TIME")
    device: str | None = option(
        None, "device preset the plan is for (memory model, host link; e.g. a100, cpu; "
        "default: a generic accelerator)", commands=("plan",), metavar="PRESET")


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How long to train, and where everything is written."""

    steps: int = option(10, "training steps (in all, counting resumed ones)",
                        parse=_positive_int, metavar="N")
    seed: int = option(0, "seeds the weights, the data and randomised placers",
                       commands=("train", "plan"), parse=int)
    run_dir: str | None = option(
        None, "where artifacts go (default: a new outcore-runs/<time>-<model>)", metavar="DIR")
    metrics_out: str | None = option(
        None, "per-step metrics, one JSON object per line (default: metrics.jsonl in the run "
        "folder)", metavar="FILE.jsonl")
    trace: str | None = option(None, "also copy the measured timeline files here",
                               metavar="DIR")
    checkpoint_dir: str | None = option(
        None, "write sharded checkpoints here (a LOCK file names the one writer). A "
        "checkpoint is code (its .metadata is a pickle): use only folders you wrote",
        metavar="DIR")
    checkpoint_every: int = option(0, "checkpoint every N steps (0: never)", parse=_count,
                                   metavar="N")
    resume: bool = option(
        False, "continue from the newest intact checkpoint in --checkpoint-dir, with the "
        "configuration it was written with (options given now replace it, and the run says "
        "which)", flag=True)
    on_nonfinite: str = option(
        "stop", "a NaN/inf loss or gradient: stop (exit non-zero naming the step and the last "
        "good checkpoint) or skip that step's update", choices=("stop", "skip"))
    timeout: float = option(60.0, "longest wait for any message or worker, seconds",
                            parse=float, metavar="SECONDS")
    explain: bool = option(
        False, "also print the plan's candidates (time, peak memory, why each lost)",
        commands=("train", "plan"), flag=True)
    timeline: bool = option(
        True, "record each rank's measured timeline of the last step and draw it under the "
        "prediction (timeline.png, trace.json in the run folder)", flag=True)


@dataclass(frozen=True, kw_only=True)
class WorkerOptions:
    """What the launcher decides for its workers (not user options).

    Attributes:
        trace_dir: where each rank writes its measured timeline of the last step.
        track_memory: measure each rank's peak tensor memory (the first two steps and every
            hundredth; other steps repeat the latest measurement).
        threads: torch threads per worker.
        spin_us: how long same-host receives poll before blocking (None: each worker decides;
            ``OUTCORE_P2P_SPIN_US`` wins over both).
        return_state: return every rank's final parameters (tests).
        fail_at_step, fail_rank, fail_mode: make a rank raise or hang at a step (fault tests).
        loss_scale: 16-mixed's first loss scale (``torch.amp.GradScaler``'s 2**16; tests start
            higher to make the scale back off).
        build_batch_bytes: whole bytes of tensor-parallel parameters a rank builds at once
            before cutting its shards (None: its share, at least 64 MiB).
    """

    trace_dir: str | None = None
    track_memory: bool = True
    threads: int | None = 1
    spin_us: float | None = None
    return_state: bool = False
    fail_at_step: int = -1
    fail_rank: int = -1
    fail_mode: str = "raise"
    loss_scale: float = 2.0 ** 16
    build_batch_bytes: int | None = None


SECTIONS: dict[str, type] = {"graph": GraphOptions, "dataset": DataOptions,
                             "optim": OptimizerOptions, "planning": PlanOptions,
                             "run": RunOptions}


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    """One training run's whole configuration (see the module docstring). Read a value as
    ``cfg.run.steps``; make one with :func:`from_options` (flat names) or :meth:`make`."""

    graph: GraphOptions = field(default_factory=GraphOptions)
    dataset: DataOptions = field(default_factory=DataOptions)
    optim: OptimizerOptions = field(default_factory=OptimizerOptions)
    planning: PlanOptions = field(default_factory=PlanOptions)
    run: RunOptions = field(default_factory=RunOptions)
    worker: WorkerOptions = field(default_factory=WorkerOptions)

    @staticmethod
    def make(**flat: Any) -> TrainConfig:
        """A worker's configuration from flat names (``model="outcore:mlp", steps=3``), its
        own fields (``track_memory``) included; values are taken as they are, and the sizes
        not given are resolved as a run would: 8 samples in 1 micro-batch."""
        worker = {f.name for f in fields(WorkerOptions)}
        flat = {"batch_size": 8, "microbatches": 1, **flat}
        cfg = from_options({k: v for k, v in flat.items() if k not in worker}, parse=False)
        return cfg.replace(**{k: v for k, v in flat.items() if k in worker})

    def replace(self, **flat: Any) -> TrainConfig:
        """This configuration with fields changed by their flat names."""
        changes: dict[str, dict[str, Any]] = {}
        for name, value in flat.items():
            changes.setdefault(_section_of(name), {})[name] = value
        return dataclasses.replace(self, **{s: dataclasses.replace(getattr(self, s), **c)
                                            for s, c in changes.items()})

    def to_dict(self) -> dict[str, Any]:
        """JSON-able, section by section."""
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(doc: Mapping[str, Any]) -> TrainConfig:
        """The inverse of :meth:`to_dict` (tuples restored; unknown fields refused)."""
        parts = {}
        for name, cls in {**SECTIONS, "worker": WorkerOptions}.items():
            values = dict(doc.get(name) or {})
            known = {f.name: f for f in fields(cls)}
            unknown = set(values) - set(known)
            if unknown:
                raise UsageError(f"unknown {name} options {sorted(unknown)} in a saved "
                                 "configuration: written by another version of outcore?")
            for k, v in values.items():
                if isinstance(v, list):
                    values[k] = tuple(v)
            parts[name] = cls(**values)
        return TrainConfig(**parts)


def _options() -> Iterator[tuple[str, dataclasses.Field]]:
    """``(section, field)`` of every user option, in declaration order."""
    for section, cls in SECTIONS.items():
        for f in fields(cls):
            yield section, f


_SECTION_OF = {f.name: s for s, f in _options()} | {f.name: "worker"
                                                     for f in fields(WorkerOptions)}


def _section_of(name: str) -> str:
    try:
        return _SECTION_OF[name]
    except KeyError:
        raise UsageError(f"unknown option {name!r}: the options are "
                         f"{', '.join(option_names())}") from None


def option_names(command: str | None = None) -> list[str]:
    """The options (flat names) a command takes, or every option."""
    return [f.name for _, f in _options()
            if command is None or command in f.metadata["option"]["commands"]]


def default_of(name: str, command: str = "train") -> Any:
    """The default of option ``name`` for ``command``."""
    f = next(f for _, f in _options() if f.name == name)
    return f.metadata["option"]["defaults"].get(command, f.default)


def from_options(options: Mapping[str, Any], *, command: str = "train",
                 parse: bool = True) -> TrainConfig:
    """A configuration from flat option names (``outcore.train``'s keyword arguments); the
    others keep their defaults for ``command``. ``parse``: check and convert each value as the
    command line does (``memory="16GiB"``, ``input_shape="8x3x32x32"``)."""
    known = set(option_names())
    unknown = [k for k in options if k not in known]
    if unknown:
        raise UsageError(f"unknown option{'s' if len(unknown) > 1 else ''} "
                         f"{', '.join(map(repr, unknown))}: the options are "
                         f"{', '.join(option_names(command))}")
    parts: dict[str, dict[str, Any]] = {s: {} for s in SECTIONS}
    for section, f in _options():
        meta = f.metadata["option"]
        if f.name in options:
            value = options[f.name]
            if parse:
                value = _parsed(f.name, meta, value)
        else:
            value = meta["defaults"].get(command, f.default)
        parts[section][f.name] = value
    return TrainConfig(**{s: SECTIONS[s](**v) for s, v in parts.items()})


def _parsed(name: str, meta: dict[str, Any], value: Any) -> Any:
    """``value`` of option ``name`` checked and converted; None stays None."""
    if value is None:
        return None
    if meta["flag"]:
        return bool(value)
    if meta["many"]:
        items = (value,) if isinstance(value, str) else tuple(value)
        return tuple(_parsed(name, {**meta, "many": False}, v) for v in items)
    flag = "--" + name.replace("_", "-")
    try:
        out = meta["parse"](value)
    except UsageError as e:
        raise UsageError(f"{flag}: {e}") from None
    if meta["choices"] and out not in meta["choices"]:
        raise UsageError(f"{flag}: {value!r} is not one of {', '.join(meta['choices'])}")
    return out


def add_options(parser: argparse.ArgumentParser, command: str, *,
                skip: tuple[str, ...] = ()) -> None:
    """Add every option ``command`` takes to ``parser`` as ``--name-with-dashes``, grouped
    by section. Options not given on the command line read as absent, and the values given
    are checked by :func:`from_args` (one line naming the option, not argparse's usage)."""
    for section, cls in SECTIONS.items():
        group = parser.add_argument_group(f"{section} options")
        for f in fields(cls):
            meta = f.metadata["option"]
            if command not in meta["commands"] or f.name in skip:
                continue
            default = meta["defaults"].get(command, f.default)
            help_text = meta["help"]
            if default not in (None, (), False, "") and "default" not in help_text:
                help_text += f" (default {default})"
            kwargs: dict[str, Any] = {"dest": f.name, "default": argparse.SUPPRESS,
                                      "help": help_text}
            name = f.name.replace("_", "-")
            if meta["flag"] and default:  # on unless switched off
                kwargs.update(action="store_false",
                              help=meta["help"] + " (on unless --no-" + name + ")")
                group.add_argument("--no-" + name, **kwargs)
                continue
            if meta["flag"]:
                kwargs["action"] = "store_true"
            else:
                kwargs["metavar"] = meta["metavar"] or ("{" + ",".join(meta["choices"]) + "}"
                                                        if meta["choices"] else None)
                if meta["many"]:
                    kwargs["action"] = "append"
            group.add_argument("--" + name, **kwargs)


def given(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """The options of ``command`` given on its command line, by flat name, checked and
    converted (:class:`UsageError` naming the flag otherwise)."""
    metas = {f.name: f.metadata["option"] for _, f in _options()}
    return {name: _parsed(name, metas[name], getattr(args, name))
            for name in option_names(command) if hasattr(args, name)}


def from_args(args: argparse.Namespace, command: str, **overrides: Any) -> TrainConfig:
    """The configuration a command line asks for: the options it gave over ``command``'s
    defaults, then ``overrides``."""
    options = {**given(args, command), **overrides}
    return from_options(options, command=command, parse=False)


def differences(old: TrainConfig, new: TrainConfig) -> list[tuple[str, Any, Any]]:
    """``(option, old value, new value)`` for every user option that differs."""
    out = []
    for section, f in _options():
        a, b = getattr(getattr(old, section), f.name), getattr(getattr(new, section), f.name)
        if a != b:
            out.append((f.name, a, b))
    return out


def options_doc(command: str = "train") -> str:
    """The options of ``command`` as a docstring section (``help(outcore.train)``)."""
    lines = []
    for _, f in _options():
        meta = f.metadata["option"]
        if command not in meta["commands"]:
            continue
        default = meta["defaults"].get(command, f.default)
        lines.append(f"    {f.name} (default {default!r}): {meta['help'].replace('%%', '%')}")
    return "\n".join(lines)


def degree(value: int | str | None, searched: bool) -> int | None:
    """A request's tensor-parallel or sharding degree from ``tp`` / ``shard``: None (the
    planner chooses) for ``auto``, and when not given while the layout is searched; 1 when not
    given otherwise."""
    if value == "auto" or (value is None and searched):
        return None
    return int(value or 1)


def train_signature() -> inspect.Signature:
    """``outcore.train``'s signature: the model, the devices, the callbacks, then every train
    option as a keyword argument with its default."""
    P = inspect.Parameter
    params = [P("model", P.POSITIONAL_OR_KEYWORD),
              P("devices", P.POSITIONAL_OR_KEYWORD, default=None),
              P("progress", P.KEYWORD_ONLY, default=None),
              P("on_metrics", P.KEYWORD_ONLY, default=None)]
    params += [P(name, P.KEYWORD_ONLY, default=default_of(name))
               for name in option_names("train") if name != "devices"]
    return inspect.Signature(params)


def dumps(cfg: TrainConfig) -> str:
    """The configuration as indented JSON (``config.json`` of a run folder)."""
    return json.dumps(cfg.to_dict(), indent=1)
