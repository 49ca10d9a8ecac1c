"""Icechunk repositories, read-only: one snapshot's arrays, read through zcrop's planner.

    snap = zcrop.open_icechunk("weather.icechunk", branch="main")
    t2m = snap["forecast/t2m"]          # a zcrop.Array
    crops = t2m.read_crops([...], (4, 128, 128))

Icechunk's own package is not needed to read: zcrop parses the repository's metadata files
(with the ``icechunk-format`` Rust crate) and reads the chunks itself, from a directory or an
object store (``s3://``, ``gs://``, ``az://`` with ``storage_options``).
"""

from __future__ import annotations

import os
from typing import Any

from zcrop._api import storage_option_pairs
from zcrop._array import Array
from zcrop._zcrop import NativeIcechunk, open_icechunk as _open_icechunk

__all__ = ["IcechunkSnapshot", "open_icechunk"]


class IcechunkSnapshot:
    """One snapshot of an Icechunk repository: its node paths and its arrays."""

    __slots__ = ("_native",)

    def __init__(self, native: NativeIcechunk) -> None:
        self._native = native

    @property
    def snapshot_id(self) -> str:
        """The snapshot's id (20 characters of Crockford base32)."""
        return self._native.id

    def nodes(self) -> list[tuple[str, bool]]:
        """Every node's path (``/``, ``/group/array``) and whether it is an array, in path
        order."""
        return self._native.nodes()

    def arrays(self) -> list[str]:
        """The paths of the arrays."""
        return [p for p, is_array in self.nodes() if is_array]

    def __getitem__(self, path: str) -> Array:
        """The array at ``path`` (``"group/array"``, a leading ``/`` optional)."""
        return Array(self._native.array(path))

    def __repr__(self) -> str:
        return f"<zcrop.IcechunkSnapshot {self.snapshot_id}: {len(self.arrays())} arrays>"


def open_icechunk(
    store: str | os.PathLike[str],
    *,
    branch: str | None = None,
    tag: str | None = None,
    snapshot: str | None = None,
    storage_options: dict[str, Any] | None = None,
    chunk_cache: int | str | None = None,
) -> IcechunkSnapshot:
    """The snapshot of the Icechunk repository at ``store`` (a directory or an object-store
    URL) that ``branch``, ``tag`` or ``snapshot`` (an id) names: at most one of them; by
    default the tip of branch ``main``. Spec v1 and v2 repositories are read."""
    if sum(v is not None for v in (branch, tag, snapshot)) > 1:
        raise ValueError("give at most one of branch=, tag= and snapshot=")
    native = _open_icechunk(
        os.fspath(store),
        branch=branch,
        tag=tag,
        snapshot=snapshot,
        storage_options=storage_option_pairs(storage_options),
        chunk_cache=chunk_cache,
    )
    return IcechunkSnapshot(native)
