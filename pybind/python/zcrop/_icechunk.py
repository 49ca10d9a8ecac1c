"""Icechunk repositories, read-only: one snapshot's groups and arrays, read through zcrop's
planner.

    snap = zcrop.open_icechunk("weather.icechunk", branch="main")
    t2m = snap["forecast/t2m"]          # a zcrop.Array
    crops = t2m.read_crops([...], (4, 128, 128))
    ds = xr.open_dataset(snap, engine="zcrop", group="forecast")

Icechunk's own package is not needed to read: zcrop parses the repository's metadata files
(with the ``icechunk-format`` Rust crate) and reads the chunks itself, from a directory or an
object store (``s3://``, ``gs://``, ``az://`` with ``storage_options``). A readonly
``icechunk.Session`` (or its ``session.store``) opens the snapshot it is at.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from zcrop._api import storage_option_pairs
from zcrop._array import Array
from zcrop._group import Group, wrap
from zcrop._zcrop import NativeIcechunk, icechunk_session_repository
from zcrop._zcrop import open_icechunk as _open_icechunk

__all__ = ["IcechunkSnapshot", "open_icechunk"]


class IcechunkSnapshot:
    """One snapshot of an Icechunk repository: its node paths, groups and arrays."""

    __slots__ = ("_native", "_storage_options", "_chunk_cache", "_containers")

    def __init__(
        self,
        native: NativeIcechunk,
        storage_options: dict[str, Any] | None = None,
        chunk_cache: int | str | None = None,
        virtual_chunk_containers: Mapping[str, Mapping[str, Any] | None] | None = None,
    ) -> None:
        self._native = native
        self._storage_options = dict(storage_options or {})
        self._chunk_cache = chunk_cache
        self._containers = {k: dict(v or {}) for k, v in (virtual_chunk_containers or {}).items()}

    @property
    def snapshot_id(self) -> str:
        """The snapshot's id (20 characters of Crockford base32)."""
        return self._native.id

    @property
    def uri(self) -> str:
        """Where the repository is: its directory, or its URL."""
        return self._native.uri

    @property
    def storage_options(self) -> dict[str, Any]:
        """The storage options the repository was opened with."""
        return dict(self._storage_options)

    @property
    def chunk_cache(self) -> int | str | None:
        """The chunk cache each array was opened with."""
        return self._chunk_cache

    @property
    def virtual_chunk_containers(self) -> dict[str, dict[str, Any]]:
        """The URL prefixes virtual chunks may be read from, with their storage options."""
        return {k: dict(v) for k, v in self._containers.items()}

    def nodes(self) -> list[tuple[str, bool]]:
        """Every node's path (``/``, ``/group/array``) and whether it is an array, in path
        order."""
        return self._native.nodes()

    def arrays(self) -> list[str]:
        """The paths of the arrays."""
        return [p for p, is_array in self.nodes() if is_array]

    def group(self, path: str = "") -> Group:
        """The group at ``path`` (the root by default), a :class:`zcrop.Group` whose members
        are the snapshot's."""
        node = self[path]
        if not isinstance(node, Group):
            raise TypeError(f"{path!r} of snapshot {self.snapshot_id} is an array, not a group")
        return node

    def __getitem__(self, path: str) -> Array | Group:
        """The array or group at ``path`` (``"group/array"``, a leading ``/`` optional;
        ``""`` for the root group)."""
        return wrap(self._native.get(path))

    def __repr__(self) -> str:
        return f"<zcrop.IcechunkSnapshot {self.snapshot_id}: {len(self.arrays())} arrays>"


def _session_of(obj: Any) -> Any | None:
    """The ``icechunk.Session`` that ``obj`` is or holds (an ``IcechunkStore``), else None.
    Duck-typed, so that importing zcrop never imports icechunk."""
    session = getattr(obj, "session", None) if type(obj).__name__ == "IcechunkStore" else obj
    inner = getattr(session, "_session", None)
    if inner is None or not hasattr(inner, "as_bytes") or not hasattr(session, "snapshot_id"):
        return None
    return session


def is_icechunk(obj: Any) -> bool:
    """Whether ``obj`` is something :func:`open_icechunk` opens without a path: an
    :class:`IcechunkSnapshot`, an ``icechunk.Session`` or an ``IcechunkStore``."""
    return isinstance(obj, IcechunkSnapshot) or _session_of(obj) is not None


def open_icechunk(
    store: Any,
    *,
    branch: str | None = None,
    tag: str | None = None,
    snapshot: str | None = None,
    storage_options: dict[str, Any] | None = None,
    chunk_cache: int | str | None = None,
    virtual_chunk_containers: Mapping[str, Mapping[str, Any] | None] | None = None,
) -> IcechunkSnapshot:
    """The snapshot of the Icechunk repository at ``store`` (a directory or an object-store
    URL) that ``branch``, ``tag`` or ``snapshot`` (an id) names: at most one of them; by
    default the tip of branch ``main``. Spec v1 and v2 repositories are read.

    ``store`` may also be an ``icechunk.Session`` (or its ``session.store``): the snapshot it
    is at, in the repository its storage names (a directory, or S3 with the session's
    endpoint and static or anonymous credentials; ``storage_options`` given here win). A
    session with uncommitted changes is refused: zcrop reads committed snapshots only.

    Virtual chunks (references to byte ranges of other files or objects) are read only from
    under the URL prefixes of ``virtual_chunk_containers``, each with its storage options
    (``{"file:///data/nc/": None, "s3://bucket/nc/": {"anon": True}}``), as icechunk reads only
    the containers its user authorized. Before a read, each target is checked against the
    version its reference recorded (last-modified time or ETag): a changed, missing or short
    target is a :class:`zcrop.StoreError` naming the array, chunk and URL, never stale data.
    """
    if sum(v is not None for v in (branch, tag, snapshot)) > 1:
        raise ValueError("give at most one of branch=, tag= and snapshot=")
    if isinstance(store, IcechunkSnapshot):
        if branch is None and tag is None and snapshot is None:
            snapshot = store.snapshot_id
        options = store.storage_options | dict(storage_options or {})
        containers = (store.virtual_chunk_containers if virtual_chunk_containers is None
                      else virtual_chunk_containers)
        return open_icechunk(store.uri, branch=branch, tag=tag, snapshot=snapshot,
                             storage_options=options or None,
                             chunk_cache=store.chunk_cache if chunk_cache is None else chunk_cache,
                             virtual_chunk_containers=containers)
    session = _session_of(store)
    if session is not None:
        if branch is not None or tag is not None or snapshot is not None:
            raise ValueError("an icechunk session is at one snapshot; branch=, tag= and "
                             "snapshot= go with a repository path or URL")
        if session.has_uncommitted_changes:
            raise ValueError("the icechunk session has uncommitted changes, which zcrop cannot "
                             "see (it reads committed snapshots): commit them, or open a "
                             "readonly session")
        location, pairs = icechunk_session_repository(session._session.as_bytes())
        options = dict(pairs) | dict(storage_options or {})
        return open_icechunk(location, snapshot=session.snapshot_id,
                             storage_options=options or None, chunk_cache=chunk_cache,
                             virtual_chunk_containers=virtual_chunk_containers)
    if not isinstance(store, (str, os.PathLike)):
        raise TypeError(
            "open_icechunk takes a repository path or URL, an icechunk.Session or an "
            f"IcechunkStore, got {type(store).__name__}"
        )
    native = _open_icechunk(
        os.fspath(store),
        branch=branch,
        tag=tag,
        snapshot=snapshot,
        storage_options=storage_option_pairs(storage_options),
        chunk_cache=chunk_cache,
        virtual_chunk_containers=[
            (prefix, storage_option_pairs(dict(options or {})) or [])
            for prefix, options in (virtual_chunk_containers or {}).items()
        ],
    )
    return IcechunkSnapshot(native, storage_options, chunk_cache, virtual_chunk_containers)
