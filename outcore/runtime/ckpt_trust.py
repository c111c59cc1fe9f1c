"""Who may write a checkpoint folder, and whether its files are the ones that were written.

A checkpoint is code: ``torch.distributed.checkpoint`` stores its ``.metadata`` as a pickle, and
loading a pickle runs whatever it names. So outcore only loads checkpoints from folders that no
other user can write, and only files whose SHA-256 digests match the ones recorded in the
checkpoint's ``COMPLETE`` marker when it was written. A digest guards against corruption and
against files swapped in later by someone who could not also rewrite the marker; the folder
permissions guard the marker itself.

One job writes a folder at a time: it holds ``LOCK`` (JSON: host, pid, process start time),
created atomically with ``O_EXCL``. A lock whose process is gone (same host, pid not running,
or a different process under that pid) is stale and is taken over with a warning; a live one is
a clear error naming its owner.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import socket
import stat
import time
from dataclasses import dataclass
from pathlib import Path

from outcore.errors import CheckpointError
from outcore.runtime.lifetime import process_exists

log = logging.getLogger(__name__)
LOCK = "LOCK"
DONE = "COMPLETE"
_CHUNK_BYTES = 1 << 20


# ---------------------------------------------------------------------------- permissions
def check_private(path: str | os.PathLike, what: str = "checkpoint folder") -> None:
    """Raise unless ``path`` (a folder or file) is owned by this user (or root) and not
    writable by group or others: whoever can write it can make outcore run their code."""
    p = Path(path)
    st = p.lstat()
    if stat.S_ISLNK(st.st_mode):
        raise CheckpointError(f"{what} {p} is a symbolic link: a checkpoint is loaded as code, "
                              "so outcore only uses real folders; pass the link's target")
    uid = os.getuid() if hasattr(os, "getuid") else None
    if uid is not None and st.st_uid not in (uid, 0):
        raise CheckpointError(f"{what} {p} belongs to another user (uid {st.st_uid}): a "
                              "checkpoint is loaded as code (pickle), so outcore only uses "
                              "your own; copy it only if you trust its author")
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        raise CheckpointError(f"{what} {p} is writable by other users (mode "
                              f"{stat.S_IMODE(st.st_mode):o}): anyone who can write it can make "
                              f"this job run their code; run `chmod go-w {p}` if you trust its "
                              "contents")


def make_private_dir(path: str | os.PathLike) -> Path:
    """Create ``path`` (and parents) with mode 0700 if missing; check it is private."""
    p = Path(path)
    if not p.exists():
        p.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.chmod(p, 0o700)
    check_private(p)
    return p


def privatise(folder: Path) -> None:
    """Make a freshly written checkpoint folder ours alone (0700 folders, 0600 files)."""
    for dirpath, dirnames, filenames in os.walk(folder):
        os.chmod(dirpath, 0o700)
        for f in filenames:
            os.chmod(os.path.join(dirpath, f), 0o600)


# ---------------------------------------------------------------------------- digests
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK_BYTES), b""):
            h.update(chunk)
    return h.hexdigest()


def digests(folder: Path) -> dict[str, str]:
    """SHA-256 of every file under ``folder`` except the marker, by relative path."""
    out = {}
    for dirpath, _, filenames in os.walk(folder):
        for f in filenames:
            full = Path(dirpath) / f
            rel = full.relative_to(folder).as_posix()
            if rel != DONE:
                out[rel] = _sha256(full)
    return dict(sorted(out.items()))


def write_marker(folder: Path, step: int) -> None:
    """Write ``COMPLETE``: the step and the digest of every file (written last)."""
    doc = {"format": "outcore-checkpoint/1", "step": step, "sha256": digests(folder)}
    tmp = folder / (DONE + ".tmp")
    tmp.write_text(json.dumps(doc, indent=1))
    os.chmod(tmp, 0o600)
    os.replace(tmp, folder / DONE)


def verify(folder: Path) -> int:
    """Check a checkpoint before anything in it is loaded; return its step.

    Raises :class:`CheckpointError` naming the file that is missing, extra or changed."""
    check_private(folder, "checkpoint")
    marker = folder / DONE
    try:
        doc = json.loads(marker.read_text())
        files, step = dict(doc["sha256"]), int(doc["step"])
    except (OSError, ValueError, KeyError, TypeError):
        raise CheckpointError(f"{marker} is not an outcore-checkpoint/1 marker (no file "
                              "digests): it is damaged, or was written by an older outcore; "
                              "its files cannot be checked, so it is not loaded") from None
    for dirpath, _, filenames in os.walk(folder):
        check_private(dirpath, "checkpoint folder")
        for f in filenames:
            full = Path(dirpath) / f
            check_private(full, "checkpoint file")
            rel = full.relative_to(folder).as_posix()
            if rel != DONE and rel not in files:
                raise CheckpointError(f"{full} is not one of the files this checkpoint was "
                                      "written with (added later)")
    for rel, want in files.items():
        full = folder / rel
        if not full.is_file():
            raise CheckpointError(f"{full} is missing")
        if _sha256(full) != want:
            raise CheckpointError(f"{full} does not match the digest recorded when it was "
                                  "written (corrupted or modified)")
    return step


# ---------------------------------------------------------------------------- lock
def _start_ticks(pid: int) -> str | None:
    """Start time of ``pid`` since boot (Linux), to tell a reused pid from the owner."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
        return text.rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def _alive(pid: int, ticks: str | None) -> bool:
    if not process_exists(pid):
        return False
    now = _start_ticks(pid)
    return ticks is None or now is None or now == ticks


@dataclass(frozen=True)
class FolderLock:
    """The lock this process holds on a checkpoint folder (release it when done)."""

    path: Path

    def release(self) -> None:
        try:
            doc = json.loads(self.path.read_text())
            if doc.get("pid") == os.getpid() and doc.get("host") == socket.gethostname():
                self.path.unlink()
        except (OSError, ValueError):
            pass


def acquire(folder: str | os.PathLike) -> FolderLock:
    """Take ``folder/LOCK`` for this process (see module docstring)."""
    root = make_private_dir(folder)
    path = root / LOCK
    me = {"host": socket.gethostname(), "pid": os.getpid(), "start": _start_ticks(os.getpid()),
          "since": time.strftime("%Y-%m-%d %H:%M:%S")}
    for _ in range(3):
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            _take_over_if_stale(path)
            continue
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps(me))
        return FolderLock(path)
    raise CheckpointError(f"could not lock {path}: another job keeps taking it")


def _take_over_if_stale(path: Path) -> None:
    try:
        doc = json.loads(path.read_text())
        host, pid = doc["host"], int(doc["pid"])
    except FileNotFoundError:
        return
    except (OSError, ValueError, KeyError, TypeError):
        raise CheckpointError(f"{path} exists but is unreadable: another job may be writing "
                              f"this folder; if none is, delete {path}") from None
    if host == socket.gethostname() and not _alive(pid, doc.get("start")):
        log.warning("taking over the stale lock %s of process %d (no longer running; its "
                    "unfinished checkpoint, if any, is ignored)", path, pid)
        aside = path.with_name(f"{LOCK}.stale.{os.getpid()}")
        try:
            os.replace(path, aside)
        except FileNotFoundError:
            return
        if json.loads(aside.read_text()) != doc:  # another job took it over meanwhile
            os.replace(aside, path)
        else:
            aside.unlink()
        return
    raise CheckpointError(f"{path.parent} is being written by another job (pid {pid} on "
                          f"{host}, since {doc.get('since', '?')}): wait for it or stop it, or "
                          f"use another --checkpoint-dir; if that job is gone, delete {path}")
