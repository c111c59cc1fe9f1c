"""One run configuration: every train option is one field of ``outcore.config``, and from it come
the command line, ``outcore.train``'s keywords and the workers' configuration."""

from __future__ import annotations

import inspect
import json

import pytest

import outcore
from outcore import config
from outcore.cli.main import build_parser
from outcore.config import TrainConfig, from_options
from outcore.errors import UsageError

# a value other than the default for every train option, as a user would give it
GIVEN = {"input_shape": "8x3x32x32", "batch_size": "16", "task": "regression",
         "leaf": ["layer1"], "costs": "estimate:a100", "data": "text:README.md", "epochs": None,
         "optimizer": "sgd", "lr": "0.05", "momentum": "0.5", "weight_decay": "0.01",
         "lr_schedule": "cosine", "devices": "4", "memory": "2GiB", "strategy": "pipeline",
         "layout": "given", "parallel": "master", "replicas": "4", "dp": "1", "tp": "auto",
         "shard": "2", "sp": "1", "sp_join": "layer1", "sp_grid": "2x1", "microbatches": "auto",
         "schedule": "gpipe", "memory_policy": "checkpoint", "batch_stats": "per-copy",
         "weights": "w.safetensors", "precision": "bf16-mixed",
         "plan": "p.json",
         "schedule_file": "s.json", "steps": "7", "seed": "3", "run_dir": "r",
         "metrics_out": "m.jsonl", "trace": "t", "checkpoint_dir": "c", "checkpoint_every": "2",
         "resume": True, "on_nonfinite": "skip", "timeout": "30", "explain": True,
         "timeline": False, "bandwidth": "100GB/s", "latency": "5us", "device": "a100"}


def _value(cfg: TrainConfig, name: str):
    """Option ``name`` of ``cfg``, from whichever section holds it."""
    return next(getattr(getattr(cfg, s), name) for s in config.SECTIONS
                if hasattr(getattr(cfg, s), name))


def _argv(command: str) -> list[str]:
    argv = [command, "outcore:mlp"]
    for name in config.option_names(command):
        value, flag = GIVEN[name], "--" + name.replace("_", "-")
        if value is None:
            continue
        if isinstance(value, bool):
            argv.append(flag if value else "--no-" + name.replace("_", "-"))
        else:
            for v in value if isinstance(value, list) else [value]:
                argv += [flag, v]
    return argv


def test_every_train_option_is_a_flag_a_keyword_and_a_field():
    """The train parser, outcore.train's signature and the configuration the workers get all
    have every option, under one spelling, and the command line's values reach the fields."""
    names = config.option_names("train")
    assert set(names) <= set(GIVEN), set(names) - set(GIVEN)
    signature = inspect.signature(outcore.train).parameters
    assert set(names) <= set(signature)
    assert signature["devices"].default is None  # positional: None is "1, or the checkpoint's"
    for name in names:
        if name != "devices":
            assert signature[name].default == config.default_of(name), name
        assert f"    {name} (default" in outcore.train.__doc__, name
    cfg = config.from_args(build_parser().parse_args(_argv("train")), "train")
    for name in names:
        if GIVEN[name] is not None:  # the flag's value is the keyword's
            assert _value(cfg, name) == _value(from_options({name: GIVEN[name]}), name), name
    assert cfg.planning.memory == "2GiB" and cfg.planning.tp == "auto"
    assert cfg.graph.input_shape == (8, 3, 32, 32) and cfg.graph.leaf == ("layer1",)
    assert cfg.run.timeline is False and cfg.run.resume is True and cfg.optim.lr == 0.05


@pytest.mark.parametrize("command", ["plan", "graph"])
def test_the_shared_options_are_spelled_the_same_in_every_command(command):
    """An option plan or graph shares with train has the same flag and help there."""
    helps = {}
    for cmd in ("train", command):
        parser = build_parser()._subparsers._group_actions[0].choices[cmd]
        helps[cmd] = {a.dest: a.help for a in parser._actions}
    for name in config.option_names(command):
        if name in config.option_names("train"):
            assert helps[command][name].split(" (default")[0] == \
                helps["train"][name].split(" (default")[0], name
    args = build_parser().parse_args(_argv(command))
    assert config.from_args(args, command).graph.costs == "estimate:a100"


def test_a_configuration_round_trips_through_json():
    cfg = TrainConfig.make(model="outcore:mlp", leaf=("a", "b"), input_shape=(4, 8),
                           track_memory=False, steps=3)
    back = TrainConfig.from_dict(json.loads(config.dumps(cfg)))
    assert back == cfg and back.graph.leaf == ("a", "b") and back.worker.track_memory is False
    with pytest.raises(UsageError, match="unknown run options"):
        TrainConfig.from_dict({**cfg.to_dict(), "run": {"stpes": 3}})


def test_bad_options_are_named_as_the_caller_spells_them():
    """From Python, an error names the keyword (``devices``); on the command line, the flag."""
    with pytest.raises(UsageError, match="unknown option 'stpes'") as e:
        outcore.train("outcore:mlp", stpes=3)
    assert "steps" in str(e.value)
    with pytest.raises(UsageError) as e:
        outcore.train("outcore:mlp", devices=0)
    assert "`devices`" in str(e.value) and "--devices" not in str(e.value)
    with pytest.raises(UsageError) as e:
        outcore.train("outcore:mlp", 4, dp=3)
    assert "dp=3" in str(e.value) and "--dp" not in str(e.value)
    from outcore.cli.main import main
    assert main(["train", "outcore:mlp", "--devices", "0"]) == 2


def test_a_plan_request_takes_the_command_lines_spellings_and_refuses_others():
    """``outcore.plan`` takes ``layout=``, ``shard=`` and ``momentum=`` as the command line
    means them; a misspelt option is one line naming the near one, not a TypeError."""
    from outcore.plan.request import PlanRequest

    req = PlanRequest.make(4, None, layout="auto", shard=2, dp=2, optimizer="sgd",
                           momentum=0.9)
    assert (req.search_layout, req.depth, req.optimizer) == (True, 2, "sgd-momentum")
    req = PlanRequest.make(4, None, layout="given", optimizer="sgd", momentum=0.0)
    assert (req.search_layout, req.optimizer) == (False, "sgd")
    with pytest.raises(UsageError, match="no option 'micro_batches'.*'microbatches'"):
        PlanRequest.make(2, None, micro_batches=2)
    with pytest.raises(UsageError, match="layout must be"):
        PlanRequest.make(2, None, layout="fixed")


def test_a_resumed_run_starts_from_its_checkpoints_configuration(tmp_path, caplog):
    """The configuration and plan saved beside the checkpoints come back; an option given now
    replaces its saved value and the run says so, and one that changes the plan drops the
    saved plan."""
    from outcore.job import SAVED_CONFIG, SAVED_PLAN, resolve
    folder = tmp_path / "ckpt"
    folder.mkdir()
    from outcore.graph.generators import make
    outcore.save_plan(outcore.plan(make("chain", 40), 2), folder / SAVED_PLAN)
    saved = from_options({"model": "outcore:mlp", "devices": 2, "batch_size": 16,
                          "memory": "64MiB", "steps": 10, "checkpoint_dir": str(folder)})
    (folder / SAVED_CONFIG).write_text(config.dumps(saved))
    with caplog.at_level("WARNING", logger="outcore.job"):
        job = resolve({"model": "outcore:mlp", "steps": 20, "resume": True,
                       "checkpoint_dir": str(folder), "run_dir": str(tmp_path / "run")})
    cfg = job.cfg
    assert (cfg.graph.batch_size, cfg.planning.memory, cfg.planning.devices) == (16, "64MiB", 2)
    assert cfg.run.steps == 20 and cfg.planning.plan == str(folder / SAVED_PLAN)
    assert "steps 10 -> 20" in caplog.text and "and its plan" in caplog.text
    with caplog.at_level("WARNING", logger="outcore.job"):
        job = resolve({"model": "outcore:mlp", "devices": 1, "resume": True,
                       "checkpoint_dir": str(folder), "run_dir": str(tmp_path / "run2")})
    assert job.cfg.planning.devices == 1 and job.cfg.planning.plan is None
    assert "devices 2 -> 1" in caplog.text and "planning again" in caplog.text


def test_the_plan_counts_the_optimizer_state_the_run_keeps(tmp_path):
    """SGD runs with momentum 0.9 unless told otherwise: its momentum buffer is a third copy of
    the parameters, which the plan's memory model must count (a plan of two copies went over
    its limit by a third)."""
    from outcore.cost.memory import state_factor
    from outcore.job import plan_request, resolve

    cases = {("sgd", None): ("sgd-momentum", 3.0), ("sgd", 0.0): ("sgd", 2.0),
             ("sgd", 0.5): ("sgd-momentum", 3.0), ("adam", None): ("adam", 4.0)}
    for (name, momentum), (planned, copies) in cases.items():
        given = {"optimizer": name} | ({} if momentum is None else {"momentum": momentum})
        cfg = TrainConfig.make(**given)
        assert cfg.optim.planned == planned and state_factor(planned) == copies
        assert outcore.api.plan_request_of(cfg).optimizer == planned
    job = resolve({"model": "outcore:mlp", "devices": 2, "optimizer": "sgd",
                   "run_dir": str(tmp_path / "run")})
    assert plan_request(job).optimizer == "sgd-momentum"


def test_a_run_says_when_batch_statistics_are_not_over_the_whole_batch():
    from outcore.graph.ir import build
    from outcore.job import _say_statistics

    def graph(middle: str):
        return build("bn", fwd_s=[1e-3] * 3, src=[0, 1], dst=[1, 2], edge_bytes=[4096.0] * 2,
                     ops=["input", middle, "output"], batch_size=4)

    said: list[str] = []

    def tell(text, done, total):
        said.append(text)

    g = graph("batch_norm")
    _say_statistics(g, outcore.plan(g, 1, microbatches=2), 8, tell)
    assert len(said) == 1 and "2 micro-batches of 4 samples" in said[0] and \
        "--microbatches" in said[0]
    _say_statistics(g, outcore.plan(g, 1, microbatches=1), 8, tell)  # the whole batch
    plain = graph("relu")  # no batch statistics
    _say_statistics(plain, outcore.plan(plain, 1, microbatches=2), 8, tell)
    assert len(said) == 1
