"""The local job's cluster counts other processes' load: on a machine whose free cores are
fewer than the workers, messages are costed at the oversubscribed latency."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from outcore.core.env import local_cores as _local_cores  # noqa: E402
from outcore.hardware.presets import link_preset  # noqa: E402
from outcore.runtime.local_cluster import OVERSUBSCRIBED_LATENCY_S, local_cluster  # noqa: E402


@pytest.mark.skipif(torch.cuda.is_available(), reason="local CPU workers only")
def test_background_load_makes_workers_oversubscribed(monkeypatch):
    cores = _local_cores()
    quiet = link_preset("gloo-loopback").latency_s
    monkeypatch.setenv("OUTCORE_P2P", "gloo")  # the preset's latency when quiet
    monkeypatch.setenv("OUTCORE_HOST_LOAD", "0")
    assert local_cluster(min(2, cores), True).intra.latency_s == quiet
    assert local_cluster(cores + 1, True).intra.latency_s == OVERSUBSCRIBED_LATENCY_S
    monkeypatch.setenv("OUTCORE_HOST_LOAD", str(cores))  # every core busy elsewhere
    assert local_cluster(2, True).intra.latency_s == OVERSUBSCRIBED_LATENCY_S
    assert local_cluster(1, True).intra.latency_s == quiet  # one worker sends no message
    assert local_cluster(2, False).intra.latency_s == quiet  # not sharing this machine


@pytest.mark.skipif(torch.cuda.is_available(), reason="local CPU workers only")
def test_background_load_counts_with_same_host_sockets(monkeypatch):
    """The same-host transport's probed latency is used when cores are free, and the
    oversubscribed latency when other processes keep them busy."""
    monkeypatch.delenv("OUTCORE_P2P", raising=False)
    monkeypatch.setenv("OUTCORE_HOST_LOAD", "0")
    free = local_cluster(2, True).intra
    assert free.latency_s < OVERSUBSCRIBED_LATENCY_S
    # messages take the probed socket costs; collectives travel over gloo's loopback, at the
    # preset's latency or gloo's probed one, the larger, at any worker count (the sums of a
    # pair over its own socket are priced by the simulator as that link's messages:
    # tests/sim/test_engine.py)
    monkeypatch.setattr("outcore.runtime.local_cluster._samehost_costs_s",
                        lambda spin_us: (1e-6, (2e-5, 3e-5), (1e-10, 1e-10)))
    monkeypatch.setattr("outcore.runtime.local_cluster.cores_to_spare", lambda devices: True)
    preset = link_preset("gloo-loopback").latency_s
    for probed in (0.0, 5e-4):  # 0: the probe could not run
        monkeypatch.setattr("outcore.runtime.local_cluster._gloo_collective_latency_s",
                            lambda probed=probed: probed)
        for devices in (2, 4):
            link = local_cluster(devices, True).intra
            assert link.latency_s == pytest.approx(1e-6) and link.copy_on_send
            assert link.latency_for_collectives == max(preset, probed)
    monkeypatch.undo()
    monkeypatch.delenv("OUTCORE_P2P", raising=False)
    monkeypatch.setenv("OUTCORE_HOST_LOAD", str(_local_cores()))
    busy = local_cluster(2, True).intra
    assert busy.latency_s == busy.latency_for_collectives == OVERSUBSCRIBED_LATENCY_S
    # one worker: the runtime's per-piece cost comes from the probe too (not the fixed
    # 50 / 150 us, which over-charged small models' single-worker steps by up to 68 %)
    monkeypatch.setattr("outcore.runtime.local_cluster._runtime_overhead_s", lambda: (1e-6, 2e-6))
    one = local_cluster(1, True).device
    assert (one.fwd_overhead_s, one.bwd_overhead_s) == (1e-6, 2e-6)


def test_background_load_counts_a_busy_process_now(monkeypatch):
    """The load is read now (runnable tasks), not as the 1-minute average that still counts a
    job which ended seconds ago: a process spinning beside this one is seen at once."""
    import subprocess
    import sys

    from outcore.core.env import background_load
    monkeypatch.delenv("OUTCORE_HOST_LOAD", raising=False)
    busy = subprocess.Popen([sys.executable, "-c", "import time\nt = time.time()\n"
                             "while time.time() - t < 20: pass"])
    try:
        import time
        time.sleep(0.3)
        assert background_load(samples=20) >= 0.5
    finally:
        busy.kill()
        busy.wait(timeout=10)


def test_the_launcher_decides_whether_receives_spin(monkeypatch):
    """Decided once before the workers start (a worker deciding for itself could count its
    starting siblings as other load); the environment variable still wins in the workers."""
    from outcore.config import TrainConfig
    from outcore.core.env import local_cores
    from outcore.core.samehost import SPIN_AUTO_US
    from outcore.job import _with_spin
    cfg = TrainConfig.make(model="outcore:mlp")
    monkeypatch.setenv("OUTCORE_HOST_LOAD", "0")
    assert _with_spin(cfg, local_cores()).worker.spin_us == SPIN_AUTO_US
    assert _with_spin(cfg, local_cores() + 1).worker.spin_us == 0.0
    monkeypatch.setenv("OUTCORE_HOST_LOAD", str(local_cores()))
    assert _with_spin(cfg, 1).worker.spin_us == 0.0


@pytest.mark.skipif(torch.cuda.is_available(), reason="local CPU workers only")
def test_gloo_collectives_are_probed_as_they_run_here():
    """Two gloo groups of this process all-reduce in threads: the mean over the two messages
    of each call, the per-message latency the simulator charges (with the tail gloo's threads
    have on a busy few cores, about 1 ms per message on 2 cores, 10x the preset's quiet 0.1)."""
    from outcore.runtime.local_cluster import _gloo_collective_latency_s

    alpha = _gloo_collective_latency_s.__wrapped__(calls=16)
    assert 1e-6 < alpha < 0.5
