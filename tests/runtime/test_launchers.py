"""outcore joins the job it is started in: torchrun, mpirun (Open MPI, MPICH, MVAPICH2), srun."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from outcore.core.env import detect, free_port


@pytest.mark.parametrize("env,launcher,rank,size,local", [
    ({"RANK": "3", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "MASTER_ADDR": "n0",
      "MASTER_PORT": "1234"}, "torchrun", 3, 8, 1),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "4",
      "OMPI_COMM_WORLD_LOCAL_RANK": "1"}, "openmpi", 1, 4, 1),
    ({"MV2_COMM_WORLD_RANK": "2", "MV2_COMM_WORLD_SIZE": "4",
      "MV2_COMM_WORLD_LOCAL_RANK": "0"}, "mvapich2", 2, 4, 0),
    ({"PMI_RANK": "5", "PMI_SIZE": "6", "MPI_LOCALRANKID": "1"}, "mpich", 5, 6, 1),
    ({"SLURM_PROCID": "7", "SLURM_NTASKS": "16", "SLURM_LOCALID": "3",
      "SLURM_JOB_NODELIST": "gpu[012-015],cpu1"}, "slurm", 7, 16, 3),
    ({}, "none", 0, 1, 0),
])
def test_detects_the_launcher(env, launcher, rank, size, local):
    job = detect(env)
    assert (job.launcher, job.rank, job.world_size, job.local_rank) == (launcher, rank, size,
                                                                        local)
    if launcher == "slurm":
        assert job.master_addr == "gpu012"
    if launcher == "torchrun":
        assert (job.master_addr, job.master_port) == ("n0", 1234)


def _losses(run_dir):
    return [json.loads(x)["loss"] for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


ARGS = ["train", "outcore:diamond", "--devices", "2", "--steps", "3", "--strategy",
        "pipeline", "--costs", "estimate:cpu", "--microbatches", "2"]


@pytest.mark.dist
@pytest.mark.timeout(300)
def test_torchrun_and_mpirun_train_the_same(tmp_path):
    port = free_port()
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-addr", "127.0.0.1", "--master-port", str(port), "-m",
                "outcore.cli.main"]
    r = subprocess.run(torchrun + ARGS + ["--run-dir", str(tmp_path / "t")], capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    report = json.loads((tmp_path / "t" / "report.json").read_text())
    assert report["devices"] == 2 and len(report["busy_s"]) == 2
    local = subprocess.run([sys.executable, "-m", "outcore.cli.main"] + ARGS +
                           ["--run-dir", str(tmp_path / "l")], capture_output=True, text=True,
                           timeout=240)
    assert local.returncode == 0, local.stderr[-2000:]
    assert _losses(tmp_path / "t") == pytest.approx(_losses(tmp_path / "l"), rel=1e-6)
    if shutil.which("mpirun") is None:
        pytest.skip("Open MPI is not installed (./quickstart test installs openmpi-bin)")
    mpirun = ["mpirun", "--allow-run-as-root", "--oversubscribe", "-np", "2", "-x",
              "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port()}", "-x",
              "OMP_NUM_THREADS=1", sys.executable, "-m", "outcore.cli.main"]
    r = subprocess.run(mpirun + ARGS + ["--run-dir", str(tmp_path / "m")], capture_output=True,
                       text=True, timeout=240)
    assert r.returncode == 0, r.stderr[-2000:]
    assert _losses(tmp_path / "m") == pytest.approx(_losses(tmp_path / "l"), rel=1e-6)


def test_a_script_without_a_main_guard_is_told_why(tmp_path):
    """Local workers are spawned: a script calling outcore without ``if __name__ ==
    "__main__":`` would re-run in each worker, whose own launch fails (the parent saw only
    "worker 0 exited with code 1"); the launch refuses before it starts a worker and names the
    missing guard, not "can only join a started process"."""
    script = tmp_path / "unguarded.py"
    script.write_text("from outcore.runtime.launch import run_local\n"
                      "def hello(ctx):\n    return ctx.rank\n"
                      "print(run_local(hello, 1, timeout_s=60))\n")
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode != 0
    assert "__main__" in r.stderr and "can only join a started process" not in r.stderr, \
        r.stderr[-2000:]
    assert "starts a run at its top level" in r.stderr and "exited with code" not in r.stderr
    guarded = tmp_path / "guarded.py"
    guarded.write_text(script.read_text().replace(
        "print(", 'if __name__ == "__main__":\n    print('))
    r = subprocess.run([sys.executable, str(guarded)], capture_output=True, text=True,
                       timeout=120, cwd=tmp_path)
    assert r.returncode == 0 and r.stdout.strip() == "[0]", r.stderr[-2000:]
