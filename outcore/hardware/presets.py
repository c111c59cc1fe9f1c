"""Device and link presets, kept as JSON data next to this module (no torch).

Every device preset is one file ``presets/<name>.json`` holding the :class:`DeviceSpec` fields, its
aliases, and a ``source`` sentence citing the vendor data-sheet figures used; links live in
``presets/links.json``. Names are case-insensitive and ``_``/space are read as ``-``
(``A100_80GB`` = ``a100-80gb``). Directories listed in the environment variable
``OUTCORE_PRESETS`` (``os.pathsep``-separated) are searched before the shipped presets, so a
machine can carry its own measured ``cpu.json`` (see :mod:`outcore.hardware.probe`). A name
ending in ``.json`` is read as a path.

Conventions of the numbers: ``peak_flops`` is dense fp32 on the vector units; ``peak_flops_tc`` is
dense fp16/bf16 on the tensor (matrix) units, never the 2:4-sparse figure; ``mem_bandwidth`` is the
data-sheet peak; link ``bandwidth`` is per direction between one pair of devices.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, fields
from functools import lru_cache
from pathlib import Path
from typing import Any

from outcore.errors import FormatError, UsageError
from outcore.hardware.spec import DeviceSpec, LinkSpec

PRESET_DIR = Path(__file__).with_suffix("")  # outcore/hardware/presets/
LINKS_FILE = "links.json"
_DEVICE_FIELDS = {f.name for f in fields(DeviceSpec)}


def normalize(name: str) -> str:
    """Canonical spelling of a preset name: lower case, ``-`` between words."""
    return "-".join(str(name).strip().lower().replace("_", " ").replace("-", " ").split())


def _search_dirs() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("OUTCORE_PRESETS", "").split(os.pathsep) if p]
    return extra + [PRESET_DIR]


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise FormatError(f"cannot read preset file {path}: {e}; fix or delete the file") from e
    if not isinstance(data, dict):
        raise FormatError(f"preset file {path} must hold one JSON object")
    return data


@lru_cache(maxsize=8)
def _device_table(dirs: tuple[Path, ...]) -> dict[str, tuple[str, Path]]:
    """Map every name and alias (normalized) to (canonical name, file); earlier dirs win."""
    table: dict[str, tuple[str, Path]] = {}
    for d in reversed(dirs):  # later (shipped) first, so user dirs override
        if not d.is_dir():
            continue
        for path in sorted(d.glob("*.json")):
            if path.name == LINKS_FILE:
                continue
            data = _read_json(path)
            if data.get("kind", "device") != "device":
                continue
            canon = normalize(data.get("name", path.stem))
            for alias in [canon, *(normalize(a) for a in data.get("aliases", []))]:
                table[alias] = (canon, path)
    return table


def _devices() -> dict[str, tuple[str, Path]]:
    return _device_table(tuple(_search_dirs()))


def preset_names() -> list[str]:
    """Canonical names of the device presets (aliases not repeated), sorted."""
    return sorted({canon for canon, _ in _devices().values()})


def spec_from_dict(data: dict[str, Any], *, where: str = "preset") -> DeviceSpec:
    """A :class:`DeviceSpec` from a preset record; ``source``/``aliases`` go to ``extra``."""
    missing = [k for k in ("name", "memory_bytes", "peak_flops", "mem_bandwidth") if k not in data]
    if missing:
        raise FormatError(f"{where} lacks {', '.join(missing)}; a device preset needs name, "
                          "memory_bytes, peak_flops and mem_bandwidth")
    kwargs = {k: v for k, v in data.items() if k in _DEVICE_FIELDS and k != "extra"}
    for k in ("memory_bytes", "peak_flops", "mem_bandwidth", "peak_flops_tc", "launch_s",
              "efficiency", "host_bandwidth"):
        if k in kwargs:
            kwargs[k] = float(kwargs[k])
    extra = dict(data.get("extra", {}))
    for k in ("source", "aliases"):
        if k in data:
            extra[k] = data[k]
    kwargs["name"] = normalize(kwargs["name"])
    return DeviceSpec(**kwargs, extra=extra)


def spec_to_dict(spec: DeviceSpec, *, source: str | None = None) -> dict[str, Any]:
    """The JSON record of ``spec`` (inverse of :func:`spec_from_dict`)."""
    data = asdict(spec)
    extra = dict(data.pop("extra") or {})
    aliases = extra.pop("aliases", [])
    src = source or extra.pop("source", None)
    extra.pop("source", None)
    return {"kind": "device", **data, "aliases": list(aliases), "extra": extra,
            "source": src or "unknown"}


def save_device_preset(spec: DeviceSpec, path: str | Path, *, source: str | None = None) -> Path:
    """Write ``spec`` as a preset file (e.g. the probe's measured ``cpu.json``)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(spec_to_dict(spec, source=source), indent=2) + "\n")
    _device_table.cache_clear()
    return path


def device_preset(name: str | DeviceSpec) -> DeviceSpec:
    """The :class:`DeviceSpec` of a preset name or alias (case-insensitive), or a ``.json`` path.

    Raises :class:`UsageError` listing the known presets when ``name`` is unknown.
    """
    if isinstance(name, DeviceSpec):
        return name
    if str(name).endswith(".json"):
        path = Path(name)
        if not path.is_file():
            raise UsageError(f"device preset file {name!r} does not exist")
        return spec_from_dict(_read_json(path), where=str(path))
    key = normalize(name)
    found = _devices().get(key)
    if found is None:
        raise UsageError(f"unknown device {name!r}; known presets: {', '.join(preset_names())} "
                         "(or give a path to a preset .json; measure this machine with "
                         "`python -m outcore.hardware.probe`)")
    return spec_from_dict(_read_json(found[1]), where=str(found[1]))


# ---------------------------------------------------------------------------- links


@lru_cache(maxsize=8)
def _link_table(dirs: tuple[Path, ...]) -> dict[str, dict[str, Any]]:
    table: dict[str, dict[str, Any]] = {}
    for d in reversed(dirs):
        path = d / LINKS_FILE
        if not path.is_file():
            continue
        for rec in _read_json(path).get("links", []):
            canon = normalize(rec["name"])
            for alias in [canon, *(normalize(a) for a in rec.get("aliases", []))]:
                table[alias] = {**rec, "name": canon}
    return table


def _links() -> dict[str, dict[str, Any]]:
    return _link_table(tuple(_search_dirs()))


def link_names() -> list[str]:
    """Canonical names of the link presets, sorted."""
    return sorted({rec["name"] for rec in _links().values()})


def link_preset(name: str) -> LinkSpec:
    """The :class:`LinkSpec` (per-direction bandwidth, latency) of a link preset name or alias."""
    rec = _links().get(normalize(name))
    if rec is None:
        raise UsageError(f"unknown link {name!r}; known links: {', '.join(link_names())} "
                         "(or give bandwidth and latency, e.g. 16GB/s and 25us)")
    return LinkSpec(bandwidth=float(rec["bandwidth"]), latency_s=float(rec["latency_s"]))


def preset_source(name: str) -> str:
    """The ``source`` sentence (data sheet, figures used) of a device or link preset."""
    rec = _links().get(normalize(name))
    if rec is not None:
        return str(rec.get("source", "unknown"))
    return str(device_preset(name).extra.get("source", "unknown"))
