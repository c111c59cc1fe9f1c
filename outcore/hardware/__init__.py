"""Device, link and cluster specs (presets as data) and probing of the live machine."""

from outcore.hardware.spec import Cluster, DeviceSpec, LinkSpec, flat_cluster

__all__ = ["Cluster", "DeviceSpec", "LinkSpec", "flat_cluster"]
