"""A checkpoint is code (DCP's ``.metadata`` is a pickle): outcore loads only checkpoints whose
files match the digests in their ``COMPLETE`` marker, from folders no other user can write; a
corrupted newest checkpoint falls back to the previous one, saying so; resuming says what it
did (resumed from step N / starting fresh / nothing left to train)."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from outcore.config import TrainConfig
from outcore.errors import CheckpointError, RuntimeFailure
from outcore.runtime import checkpoint, ckpt_trust
from outcore.runtime.launch import run_local
from outcore.runtime.worker import train_worker
from tests.runtime.helpers import chunks, docs_for, reference

pytestmark = [pytest.mark.dist, pytest.mark.timeout(240)]

BASE = dict(model="outcore:mlp", batch_size=8, microbatches=2, lr=1e-2, track_memory=False)


class _Payload:
    """Pickled into a forged ``.metadata``: loading it would create ``marker``."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (open, (self.marker, "w"))


def _run(cfg: TrainConfig):
    graph_doc, plan_doc, _ = docs_for(cfg, lambda g: chunks(g, 2), 2)
    return run_local(train_worker, 2, (cfg, graph_doc, plan_doc), timeout_s=60)


def _flip_a_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))


def test_resume_checks_digests_and_falls_back(tmp_path, capfd):
    ckpt = tmp_path / "ckpt"
    metrics = tmp_path / "m.jsonl"
    # --resume on an empty folder: says it starts fresh
    _run(TrainConfig.make(**BASE, steps=4, checkpoint_dir=str(ckpt), checkpoint_every=2,
                          resume=True, metrics_out=str(metrics)))
    assert "starting fresh" in capfd.readouterr().err
    assert [s for s, _ in checkpoint.complete(ckpt)] == [4, 2]
    marker = json.loads((ckpt / "step_4" / "COMPLETE").read_text())
    assert ".metadata" in marker["sha256"] and marker["step"] == 4
    for step in (2, 4):
        ckpt_trust.verify(ckpt / f"step_{step}")  # as written: trusted

    # resuming a finished run: one clear line, no traceback
    with pytest.raises(RuntimeFailure) as err:
        _run(TrainConfig.make(**BASE, steps=4, checkpoint_dir=str(ckpt), resume=True))
    assert "nothing to resume" in str(err.value) and "Traceback" not in str(err.value)

    # someone swaps in a .metadata that runs code when unpickled: refused before loading;
    # the run falls back to step 2, says so, and continues exactly like single-process training
    forged = tmp_path / "forged-ran"
    (ckpt / "step_4" / ".metadata").write_bytes(pickle.dumps(_Payload(str(forged))))
    cfg = TrainConfig.make(**BASE, steps=6, checkpoint_dir=str(ckpt), resume=True,
                           metrics_out=str(metrics))
    resumed = _run(cfg)[0]["losses"]
    err_text = capfd.readouterr().err
    assert not forged.exists(), "the forged pickle was loaded"
    assert "step_4/.metadata does not match the digest" in err_text, err_text
    assert "falling back" in err_text and "resumed from step 2" in err_text, err_text
    ref = reference(cfg)[0]
    assert resumed == pytest.approx(ref[2:], rel=1e-5)
    logged = [json.loads(x) for x in metrics.read_text().splitlines()]
    assert [m["step"] for m in logged] == list(range(6))  # steps 2-3 not logged twice

    # every checkpoint damaged: fails naming the file
    data = sorted((ckpt / "step_2").glob("*.distcp"))[0]
    _flip_a_byte(data)
    with pytest.raises(CheckpointError) as err:
        _run(cfg)
    assert "no usable checkpoint" in str(err.value) and "step_4/.metadata" in str(err.value)
    assert not (ckpt / "LOCK").exists()


def test_folders_writable_by_others_are_refused(tmp_path):
    folder = tmp_path / "ckpt"
    folder.mkdir(mode=0o700)
    os.chmod(folder, 0o770)
    with pytest.raises(CheckpointError, match="writable by other users"):
        ckpt_trust.acquire(folder)
    os.chmod(folder, 0o700)
    step = folder / "step_1"
    step.mkdir(mode=0o700)
    (step / "data").write_bytes(b"x")
    ckpt_trust.privatise(step)
    ckpt_trust.write_marker(step, 1)
    assert ckpt_trust.verify(step) == 1
    os.chmod(step / "data", 0o666)
    with pytest.raises(CheckpointError, match="data is writable by other users"):
        ckpt_trust.verify(step)
    os.chmod(step / "data", 0o600)
    (step / "extra").write_bytes(b"y")
    os.chmod(step / "extra", 0o600)
    with pytest.raises(CheckpointError, match="extra is not one of the files"):
        ckpt_trust.verify(step)
    (step / "extra").unlink()
    (step / "COMPLETE").write_text("1")  # the old marker, without digests
    with pytest.raises(CheckpointError, match="no file digests"):
        ckpt_trust.verify(step)


def test_a_new_checkpoint_folder_is_private(tmp_path):
    folder = ckpt_trust.make_private_dir(tmp_path / "a" / "ckpt")
    assert folder.stat().st_mode & 0o777 == 0o700
