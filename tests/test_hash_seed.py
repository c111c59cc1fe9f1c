"""``outcore.api.fixed_hash_seed``: a program runs with one string-hash seed, which its workers
inherit, so a model's code that iterates a set of strings traces alike in every process."""

from __future__ import annotations

import os
import subprocess
import sys

CODE = ("import os, outcore.api as a; a.fixed_hash_seed(); "
        "print(os.environ['PYTHONHASHSEED'], hash('layer_types'))")


def _run(env: dict[str, str]) -> str:
    return subprocess.run([sys.executable, "-c", CODE], env=env, capture_output=True,
                          text=True, timeout=120, check=True).stdout.strip()


def test_a_program_without_a_seed_is_started_again_with_one():
    env = {k: v for k, v in os.environ.items() if k != "PYTHONHASHSEED"}
    first, second = _run(env), _run(env)
    assert first == second and first.startswith("0 ")


def test_a_seed_the_user_sets_is_kept():
    env = {**os.environ, "PYTHONHASHSEED": "7"}
    assert _run(env).startswith("7 ")
