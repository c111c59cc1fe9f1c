"""Inputs that can be checked up front are refused before capture, profiling and workers:
the model named here does not exist, so any error but the input's own means the check came
too late."""

import os
import stat
import subprocess
import sys

import pytest

import outcore
from outcore.errors import UsageError

NO_MODEL = "no_such_module_for_outcore:build"  # capturing it would fail with a ModelError


def _train(**options):
    return outcore.train(NO_MODEL, 2, steps=2, costs="estimate:cpu", **options)


def test_missing_data_is_refused_first(tmp_path):
    with pytest.raises(UsageError, match="no folder at"):
        _train(data=f"imagefolder:{tmp_path / 'missing'}")
    with pytest.raises(UsageError, match="no folder at"):
        _train(data=f"tiles:{tmp_path / 'missing'}")
    (tmp_path / "file.txt").write_text("x")
    with pytest.raises(UsageError, match="no folder at"):  # a file where a folder belongs
        _train(data=f"imagefolder:{tmp_path / 'file.txt'}")
    with pytest.raises(UsageError, match="no file at"):
        _train(data=f"text:{tmp_path}")
    with pytest.raises(UsageError, match="unknown data 'bogus:1'"):
        _train(data="bogus:1")
    with pytest.raises(UsageError, match="unknown data 'text:'"):
        _train(data="text:")


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes through any folder's permissions")
def test_unwritable_checkpoint_folder_is_refused_first(tmp_path):
    locked = tmp_path / "locked"
    locked.mkdir()
    locked.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        with pytest.raises(UsageError, match="cannot write checkpoints"):
            _train(checkpoint_dir=str(locked / "ckpt"))
    finally:
        locked.chmod(stat.S_IRWXU)


def test_checkpoint_folder_that_cannot_exist_is_refused_first(tmp_path):
    (tmp_path / "a-file").write_text("x")
    with pytest.raises(UsageError, match="cannot write checkpoints to .*a-file/ckpt"):
        _train(checkpoint_dir=str(tmp_path / "a-file" / "ckpt"))


def test_nothing_to_resume_is_refused_first(tmp_path):
    with pytest.raises(UsageError, match="`resume` needs `checkpoint_dir`"):
        _train(resume=True)
    done = tmp_path / "ckpt" / "step_4"
    done.mkdir(parents=True)
    (done / "COMPLETE").write_text("{}")  # a finished run's last checkpoint
    with pytest.raises(UsageError, match="nothing to resume: .*step_4 is after step 4"):
        _train(checkpoint_dir=str(tmp_path / "ckpt"), resume=True)


def test_the_command_line_says_it_in_one_line_without_warnings(tmp_path):
    """One error line, the flag spelled as typed, and nothing after it (no traceback, no
    leaked-semaphore warning from a worker)."""
    r = subprocess.run([sys.executable, "-m", "outcore.cli.main", "train", "outcore:mlp",
                        "--devices", "2", "--costs", "estimate:cpu", "--data",
                        f"imagefolder:{tmp_path / 'missing'}"], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 2
    assert r.stderr.strip().splitlines() == [
        f"outcore train: error: no folder at {tmp_path / 'missing'} (--data "
        "imagefolder:FOLDER: one sub-folder of images per class)"]


def test_more_workers_than_gpus_are_refused_first(monkeypatch):
    """On a machine with one GPU, two local workers would each need one (NCCL): refused in one
    line naming the GPUs there are and what to run instead, before capture and before any
    worker starts."""
    import torch

    from outcore.runtime.launch import run_local

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    monkeypatch.setattr(torch.distributed, "is_nccl_available", lambda: True)
    # (the API names its own argument where the command line says --devices)
    with pytest.raises(UsageError, match=r"2 workers need 2 GPUs, one each, and this machine "
                                         r"has 1: pass devices=1 \(or fewer\), or run the "
                                         r"workers on the CPU with CUDA_VISIBLE_DEVICES"):
        _train()
    with pytest.raises(UsageError, match="3 workers need 3 GPUs"):
        run_local(print, 3)
