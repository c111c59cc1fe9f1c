"""Two jobs started in the same second get two run folders."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from outcore.runtime.rundir import unique_run_dir


def test_run_folders_started_together_are_distinct(tmp_path):
    with ThreadPoolExecutor(4) as pool:
        dirs = list(pool.map(lambda _: unique_run_dir(tmp_path, "mlp"), range(8)))
    assert len(set(dirs)) == 8 and all(d.is_dir() and d.parent == tmp_path for d in dirs)
    names = sorted(d.name for d in dirs)
    assert any(n.endswith("-mlp") for n in names)  # the first keeps the plain name
