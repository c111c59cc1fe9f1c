"""The README runs as written: its commands and snippets, in order, in an empty folder.

Fenced blocks are read by their info string: ``bash`` blocks are commands (``\\`` continues a
line; ``#`` lines are comments), ``python`` blocks are scripts, and a block whose first line is
``# file: NAME`` is that file, written for the blocks after it. ``slow`` blocks run only in
the slow suite; ``skip`` blocks (the quick start itself, cluster launches, fragments) never run.
Every command must exit 0, and every file it is asked to write (``-o``, ``--picture``,
``--gantt``, ``--trace``, ``--schedule-out``, ``> FILE``) must exist afterwards.
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
OUTPUT_FLAGS = ("-o", "--output", "--picture", "--gantt", "--trace", "--schedule-out")


@dataclass
class Block:
    kind: str        # bash or python
    tags: tuple[str, ...]
    text: str
    line: int        # where it starts in the README

    @property
    def file(self) -> str | None:
        first = self.text.splitlines()[0] if self.text.strip() else ""
        m = re.match(r"#\s*file:\s*(\S+)", first)
        return m.group(1) if m else None


def blocks() -> list[Block]:
    out, lines = [], README.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"```(\w+)(.*)$", lines[i])
        if m and m.group(1) in ("bash", "python"):
            start, body = i + 1, []
            i += 1
            while not lines[i].startswith("```"):
                body.append(lines[i])
                i += 1
            out.append(Block(m.group(1), tuple(m.group(2).split()), "\n".join(body) + "\n",
                             start + 1))
        i += 1
    return out


def commands(text: str) -> list[str]:
    """The commands of a bash block: continuation lines joined, comments dropped."""
    out, current = [], ""
    for line in text.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.rstrip().endswith("\\"):
            current += line.rstrip()[:-1] + " "
            continue
        out.append(current + line.strip())
        current = ""
    return out


def outputs(command: str) -> list[str]:
    """The files a command is asked to write."""
    words = shlex.split(command.split("||")[0].split("#")[0])
    found = [words[i + 1] for i, w in enumerate(words[:-1]) if w in OUTPUT_FLAGS]
    if ">" in words:
        found.append(words[words.index(">") + 1])
    if "||" in command:  # a command the README expects may fail
        return []
    return found


def run_readme(tmp_path: Path, *, slow: bool) -> list[str]:
    """Run the README's blocks; return what ran (for the assertion messages)."""
    env = dict(os.environ, PATH=f"{Path(sys.executable).parent}{os.pathsep}"
               f"{os.environ.get('PATH', '')}", PYTHONPATH=str(README.parent),
               MPLBACKEND="Agg", OMP_NUM_THREADS="1")
    ran = []
    for n, b in enumerate(blocks()):
        if "skip" in b.tags or ("slow" in b.tags and not slow):
            continue
        if b.kind == "python":
            name = b.file or f"readme_snippet_{n}.py"
            (tmp_path / name).write_text(b.text)
            if b.file:
                continue
            cmd = f"{shlex.quote(sys.executable)} {name}"
        for command in (commands(b.text) if b.kind == "bash" else [cmd]):
            r = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, text=True,
                               capture_output=True, timeout=900)
            ran.append(command)
            assert r.returncode == 0, (f"README line {b.line}: `{command}` exited "
                                       f"{r.returncode}\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}")
            for f in outputs(command):
                assert (tmp_path / f).exists(), f"README line {b.line}: `{command}` wrote no {f}"
    return ran


def test_the_readme_blocks_are_what_the_test_reads():
    """The parser sees every command: the blocks it runs, those it leaves to the slow suite,
    and files (a block it cannot read would silently pass)."""
    bs = blocks()
    assert any(b.kind == "bash" and not b.tags for b in bs)
    assert any("slow" in b.tags for b in bs) and any(b.file for b in bs)
    assert any(b.kind == "python" and not b.tags and not b.file for b in bs)
    for b in bs:
        for command in commands(b.text) if b.kind == "bash" else []:
            assert not command.endswith("\\"), command
    assert outputs("outcore plan g.json -o p.json --picture p.png > x.txt") == \
        ["p.json", "p.png", "x.txt"]


@pytest.mark.dist
@pytest.mark.timeout(1500)
def test_the_readme_runs_as_written(tmp_path):
    ran = run_readme(tmp_path, slow=False)
    assert any(c.startswith("outcore train") for c in ran)
    assert (tmp_path / "plan.json").exists() and (tmp_path / "run-resumed").is_dir()


@pytest.mark.slow
@pytest.mark.dist
@pytest.mark.timeout(3000)
def test_the_readme_runs_as_written_with_its_slow_commands(tmp_path):
    ran = run_readme(tmp_path, slow=True)
    assert any(c.startswith("torchrun") for c in ran)
