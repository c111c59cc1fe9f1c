"""Find out which job this process is part of: torchrun, mpirun (Open MPI, MPICH/Hydra,
MVAPICH2), srun (Slurm), or none (then outcore spawns local workers itself)."""

from __future__ import annotations

import os
import socket
import time
from dataclasses import dataclass

from outcore.errors import LaunchError


@dataclass(frozen=True)
class JobEnv:
    """Rank, world size and rendezvous of the job this process is in."""

    launcher: str  # torchrun | openmpi | mpich | mvapich2 | slurm | none
    rank: int
    world_size: int
    local_rank: int
    master_addr: str
    master_port: int


_VARS = [  # launcher, rank, size, local rank
    ("torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK"),
    ("openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK"),
    ("mvapich2", "MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE", "MV2_COMM_WORLD_LOCAL_RANK"),
    ("mpich", "PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID"),
    ("slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID"),
]


def detect(environ: dict[str, str] | None = None) -> JobEnv:
    """The job this process is in (``launcher='none'`` when started by hand)."""
    env = os.environ if environ is None else environ
    for name, rank_var, size_var, local_var in _VARS:
        if rank_var in env and size_var in env:
            try:
                rank, size = int(env[rank_var]), int(env[size_var])
                local = int(env.get(local_var, rank))
            except ValueError:
                raise LaunchError(f"{rank_var}/{size_var} are not integers: cannot join the "
                                  f"{name} job") from None
            addr = env.get("MASTER_ADDR") or _slurm_master(env) or "127.0.0.1"
            port = int(env.get("MASTER_PORT", "29500"))
            return JobEnv(name, rank, size, local, addr, port)
    return JobEnv("none", 0, 1, 0, "127.0.0.1", 0)


def _slurm_master(env: dict[str, str]) -> str | None:
    """First host of ``SLURM_JOB_NODELIST`` (``node[01-04],x`` -> ``node01``)."""
    nodes = env.get("SLURM_JOB_NODELIST") or env.get("SLURM_NODELIST")
    if not nodes:
        return None
    first = nodes.split(",")[0]
    if "[" in first:
        base, rng = first.split("[", 1)
        first = base + rng.rstrip("]").split("-")[0].split(",")[0]
    return first


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port on ``host`` that is free right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def background_load(samples: int = 10, every_s: float = 0.005) -> float:
    """Runnable processes on this machine besides this one, now: the mean over ``samples``
    readings of the kernel's count of runnable tasks (``/proc/loadavg``), less this process;
    where that is not available, the 1-minute load average less this process.
    ``OUTCORE_HOST_LOAD`` overrides it (e.g. ``0`` for a dedicated machine).

    On 2 cores with other jobs running, 2 workers are oversubscribed: their messages take
    1.5-2 ms instead of 0.1 ms (the fidelity matrix's 2-worker cells: 60 % slower). The
    1-minute average lags: for a minute after a job of our own ends it still counts it (load
    1.8 on an idle machine), which would price a 2-worker plan as oversubscribed."""
    given = os.environ.get("OUTCORE_HOST_LOAD")
    if given:
        return max(0.0, float(given))
    try:
        running = []
        for k in range(samples):
            with open("/proc/loadavg") as f:
                running.append(int(f.read().split()[3].split("/")[0]) - 1)
            if k + 1 < samples:
                time.sleep(every_s)
        return max(0.0, sum(running) / len(running))
    except (OSError, ValueError, IndexError):
        pass
    try:
        return max(0.0, os.getloadavg()[0] - 1.0)
    except (AttributeError, OSError):  # no load average on this platform
        return 0.0


def local_cores() -> int:
    """CPU cores this process may use (the local workers share them)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def cores_to_spare(local_ranks: int) -> bool:
    """Whether ``local_ranks`` busy processes of a job each have a core of their own, counting
    the other processes' load (:func:`background_load`)."""
    return local_ranks + round(background_load()) <= local_cores()
