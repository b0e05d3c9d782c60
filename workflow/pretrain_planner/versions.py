"""What software a run ran: an installed distribution's version, or None where it is not installed. One home for
the question every record of a run asks (a cell's result, the kernels a method used, the GPU check's environment).
Imports no torch."""

from __future__ import annotations

from importlib import metadata


def installed_version(dist: str) -> str | None:
    """The installed version of distribution `dist` (e.g. "flash-attn"), None if it is not installed."""
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def installed_versions(dists: tuple[str, ...] | list[str]) -> dict[str, str | None]:
    """{dist: its installed version or None}, in the order given."""
    return {d: installed_version(d) for d in dists}
