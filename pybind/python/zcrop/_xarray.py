"""The xarray backend: ``xr.open_dataset(path, engine="zcrop")``.

zcrop reads the store's metadata documents and every value; xarray's own Zarr store class
(``xarray.backends.zarr.ZarrStore``) turns the documents into variables, dimensions,
attributes and encodings, so a dataset opened here is the one ``xr.open_zarr`` gives, CF
decoding included. To that end the documents zcrop read are handed to zarr-python as an
in-memory consolidated store (metadata only, no chunk is ever read through it); each variable's
data is then swapped for a lazy :class:`ZcropBackendArray` over the zcrop array.
"""

from __future__ import annotations

import concurrent.futures
import functools
import json
import os
import threading
import warnings
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

import numpy as np

from zcrop import _api, _indexing
from zcrop._array import Array, AsyncArray, read_crops_many
from zcrop._group import Group
from zcrop._icechunk import IcechunkSnapshot, is_icechunk, open_icechunk
from zcrop.errors import UnsupportedError, ZcropError

try:
    import xarray as xr
    from xarray.backends import BackendArray, BackendEntrypoint
    from xarray.backends.store import StoreBackendEntrypoint
    from xarray.backends.zarr import ZarrStore
    from xarray.core import indexing
except ImportError as e:  # pragma: no cover - exercised only without xarray installed
    raise ImportError("zcrop's xarray backend needs xarray (pip install xarray zarr)") from e

__all__ = [
    "ZcropBackendArray",
    "ZcropBackendEntrypoint",
    "open_dataset",
    "open_datatree",
    "read_windows",
]

#: Metadata keys of Zarr v2 documents that zarr-python keeps in ``.zarray`` (the rest of
#: zcrop's normalised document, ``node_type`` and ``attributes``, goes elsewhere).
_V2_NOT_ZARRAY = ("node_type", "attributes")


class ZcropBackendArray(BackendArray):
    """One variable's values, read by zcrop when xarray asks for them.

    Outer (orthogonal) selections go to ``Array.oindex``; vectorized selections made of integer
    arrays only go to ``Array.vindex`` (others are read as an outer selection and finished by
    xarray in memory); basic ones to ``Array[...]``. Pickles as its store, path and options and
    reopens there, so dask's process and distributed schedulers can ship it.
    """

    __slots__ = ("_array", "_async", "_group", "_reopen", "dtype", "shape")

    def __init__(self, array: Array, dtype: np.dtype[Any], reopen: tuple[str, str, dict[str, Any]],
                 group: _Siblings | None = None):
        self._array = array
        self._async: AsyncArray | None = None
        self._reopen = reopen
        self._group = group
        self.shape = tuple(array.shape)
        self.dtype = dtype
        if group is not None:
            group.members.append(self)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_reopen_backend_array, (self._reopen, self.dtype))

    def _support(self, key: indexing.ExplicitIndexer) -> indexing.IndexingSupport:
        if isinstance(key, indexing.VectorizedIndexer) and all(
            isinstance(k, np.ndarray) for k in key.tuple
        ):
            return indexing.IndexingSupport.VECTORIZED
        return indexing.IndexingSupport.OUTER

    def _method(self, key: indexing.ExplicitIndexer, support: indexing.IndexingSupport) -> Any:
        if support is indexing.IndexingSupport.VECTORIZED:
            return self._array.vindex.__getitem__
        if isinstance(key, indexing.BasicIndexer):
            return self._array.__getitem__
        return self._array.oindex.__getitem__

    def __getitem__(self, key: indexing.ExplicitIndexer) -> Any:
        support = self._support(key)
        method = self._method(key, support)
        group = self._group
        if group is not None:
            return indexing.explicit_indexing_adapter(
                key, self.shape, support, lambda raw: group.read(self, raw, method)
            )
        return indexing.explicit_indexing_adapter(key, self.shape, support, method)

    async def async_getitem(self, key: indexing.ExplicitIndexer) -> Any:
        if self._async is None:
            self._async = AsyncArray(self._array.native)
        arr = self._async
        support = self._support(key)
        if support is indexing.IndexingSupport.VECTORIZED:
            method = arr.vindex.getitem
        elif isinstance(key, indexing.BasicIndexer):
            method = arr.getitem
        else:
            method = arr.oindex.getitem
        return await indexing.async_explicit_indexing_adapter(key, self.shape, support, method)


def _prefetch_pool() -> concurrent.futures.ThreadPoolExecutor:
    """Threads for reads started ahead (zcrop releases the GIL while reading); this process's
    own (a forked child makes its own)."""
    global _POOL
    if _POOL is None or _POOL[0] != os.getpid():
        _POOL = (os.getpid(), concurrent.futures.ThreadPoolExecutor(
            max_workers=8, thread_name_prefix="zcrop-xarray"))
    return _POOL[1]


_POOL: tuple[int, concurrent.futures.ThreadPoolExecutor] | None = None


def _selection(raw: Any) -> tuple[Any, ...] | None:
    """A hashable form of a selection made of integers and slices (None for any other)."""
    if not isinstance(raw, tuple):
        raw = (raw,)
    out: list[Any] = []
    for k in raw:
        if isinstance(k, slice):
            out.append((k.start, k.stop, k.step))
        elif isinstance(k, (int, np.integer)):
            out.append(int(k))
        else:
            return None
    return tuple(out)


def _box(
    raw: Any, shape: tuple[int, ...]
) -> tuple[np.ndarray[Any, Any], list[int], tuple[int, ...]] | None:
    """A basic selection whose every dimension is one range (unit-step slices and integers) as
    a crop: its origin ``(1, ndim)``, its extent and the shape of the values it selects;
    ``None`` for any other selection, and for one that selects nothing or lies outside
    ``shape`` (its own read then says why)."""
    try:
        sel = _indexing.basic(raw, shape)
    except IndexError:
        return None
    ranges = [d for d in sel.dims if isinstance(d, tuple)]
    if not sel.shape or 0 in sel.shape or len(ranges) != len(sel.dims):
        return None
    origin = np.asarray([[start for start, _ in ranges]], dtype=np.uint64)
    return origin, [n for _, n in ranges], sel.shape


class _Siblings:
    """The variables of one dataset over the same dimensions, read together when they are read
    together.

    xarray's ``Dataset.load()`` reads variables one after the other, each with the same
    selection (``ds.isel(window).load()``), so the reads wait on each other. Once two of these
    variables have read one selection in a row, the first variable to read a new selection
    also starts, in the background, the reads of it by the variables that read the last one,
    and they take those results when their turn comes: a box of unit-step slices and integers
    is one planned batch over all of them (as :func:`read_windows` reads), other selections one
    read per variable. A read started so that no variable takes (the caller changed which
    variables it reads) is a strike: reading ahead stops until two variables read one
    selection again, and after two strikes for good.
    """

    def __init__(self) -> None:
        self.members: list[ZcropBackendArray] = []
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.key: tuple[Any, ...] | None = None
        self.readers: set[int] = set()
        self.pending: dict[int, concurrent.futures.Future[Any]] = {}
        self.active = False
        self.strikes = 0
        #: Reads started ahead, and reads that took such a result (for tests and benchmarks).
        self.started = 0
        self.taken = 0

    def read(self, member: ZcropBackendArray, raw: Any, method: Any) -> Any:
        """``method(raw)`` for ``member``, or the result of the same read started ahead."""
        key = _selection(raw)
        if key is None:
            return method(raw)
        if self.pid != os.getpid():
            # A child of fork: the parent's lock may have been held by a thread that is not
            # here, and its reads started ahead never finish here.
            self.pid, self.lock, self.pending, self.key = os.getpid(), threading.Lock(), {}, None
        together: list[tuple[ZcropBackendArray, concurrent.futures.Future[Any]]] = []
        box = None
        with self.lock:
            if key != self.key:
                if self.pending:
                    self.strikes += 1
                    self.active = False
                    self.pending.clear()
                previous, self.key, self.readers = self.readers, key, set()
                if self.active:
                    others = [m for m in self.members if m is not member and id(m) in previous]
                    box = _box(raw, member.shape)
                    if box is not None and not any(m._array.native.variable_kind
                                                   for m in (member, *others)):
                        together = [(m, concurrent.futures.Future()) for m in others]
                        self.pending.update((id(m), f) for m, f in together)
                    else:
                        pool = _prefetch_pool()
                        for m in others:
                            self.pending[id(m)] = pool.submit(m._array.__getitem__, raw)
                    self.started += len(others)
            self.readers.add(id(member))
            if len(self.readers) >= 2 and self.strikes < 2:
                self.active = True
            ahead = self.pending.pop(id(member), None)
            if ahead is not None:
                self.taken += 1
        if together:
            assert box is not None
            _prefetch_pool().submit(self._read_together, together, box)
        elif ahead is not None:
            got = ahead.result()
            if got is not None:
                return got
        return method(raw)

    @staticmethod
    def _read_together(
        together: list[tuple[ZcropBackendArray, concurrent.futures.Future[Any]]],
        box: tuple[np.ndarray[Any, Any], list[int], tuple[int, ...]],
    ) -> None:
        """The variables' reads of ``box`` as one batch; each future gets its variable's values,
        or ``None`` where the batch failed (each variable then reads on its own, so an error
        names the variable it belongs to)."""
        origin, crop, shape = box
        try:
            got = read_crops_many([(m._array, origin, crop) for m, _ in together])
        except BaseException:
            for _, future in together:
                future.set_result(None)
            return
        for (_, future), values in zip(together, got, strict=True):
            future.set_result(values.reshape(shape))


def _reopen_backend_array(
    reopen: tuple[str, str, dict[str, Any]], dtype: np.dtype[Any]
) -> ZcropBackendArray:
    root, path, options = reopen
    options = dict(options)
    snapshot = options.pop("icechunk_snapshot", None)
    if snapshot is not None:
        node = open_icechunk(root, snapshot=snapshot, **options)[path]
        assert isinstance(node, Array)
        array = node
    else:
        array = _api.open_array(root, path=path, **options)
    return ZcropBackendArray(array, dtype, reopen)


class ZcropStore(ZarrStore):
    """xarray's Zarr store over metadata that zcrop read, with zcrop arrays for the data."""

    __slots__ = ("_zcrop_arrays", "_zcrop_reopen", "_zcrop_siblings")

    def __init__(
        self,
        zarr_group: Any,
        arrays: Mapping[str, Array],
        reopen: tuple[str, dict[str, Any]],
        use_zarr_fill_value_as_mask: bool | None,
    ) -> None:
        self._zcrop_arrays = dict(arrays)
        self._zcrop_reopen = reopen
        #: The variables over the same dimensions and shape (see :class:`_Siblings`).
        self._zcrop_siblings: dict[tuple[Any, ...], _Siblings] = {}
        if use_zarr_fill_value_as_mask is None:
            # xarray's default: Zarr's fill value masks values in v2 data, not in v3.
            use_zarr_fill_value_as_mask = zarr_group.metadata.zarr_format == 2
        super().__init__(
            zarr_group, mode="r", use_zarr_fill_value_as_mask=use_zarr_fill_value_as_mask
        )

    def __getstate__(self) -> dict[str, Any]:
        # A dataset pickles with its store (``Dataset._close``), which it only closes; its
        # variables pickle their arrays by path. So the copy keeps no arrays, read-ahead groups,
        # metadata or members (zarr-python's group over zcrop's documents does not pickle).
        state = {
            k: getattr(self, k)
            for cls in type(self).__mro__
            for k in getattr(cls, "__slots__", ())
            if hasattr(self, k)
        }
        state.update(_zcrop_arrays={}, _zcrop_siblings={}, zarr_group=None, _members={},
                     _close_store_on_close=False)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        for k, v in state.items():
            object.__setattr__(self, k, v)

    def open_store_variable(self, name: str) -> xr.Variable:
        var = super().open_store_variable(name)  # type: ignore[no-untyped-call]
        array = self._zcrop_arrays[name]
        root, options = self._zcrop_reopen
        zarr_wrapper = var._data.array  # xarray's ZarrArrayWrapper: it knows the dtype to show
        group = self._zcrop_siblings.setdefault((var.dims, tuple(array.shape)), _Siblings())
        data = indexing.LazilyIndexedArray(
            ZcropBackendArray(array, zarr_wrapper.dtype, (root, array.path, options), group)
        )
        return xr.Variable(var.dims, data, var.attrs, var.encoding)


def _long_form(codecs: list[Any]) -> list[Any]:
    """v3 codec lists with each codec as ``{"name": ..., "configuration": ...}``: zcrop (zarrs)
    writes a codec without configuration as its bare name, which zarr-python does not read."""
    out = []
    for c in codecs:
        if isinstance(c, str):
            c = {"name": c}
        elif isinstance(c, dict) and isinstance(c.get("configuration"), dict):
            cfg = dict(c["configuration"])
            for key in ("codecs", "index_codecs"):
                if isinstance(cfg.get(key), list):
                    cfg[key] = _long_form(cfg[key])
            c = {**c, "configuration": cfg}
        out.append(c)
    return out


def _group_document(group: Group) -> dict[str, Any]:
    if group.zarr_format == 3:
        return {"zarr_format": 3, "node_type": "group", "attributes": group.attrs.asdict()}
    return {"zarr_format": 2}


def _add_documents(
    docs: dict[str, Any], prefix: str, node: Array | Group, zarr_format: int
) -> None:
    """Adds ``node``'s metadata documents under ``prefix`` (``""`` for the root) to ``docs``,
    keyed as consolidated metadata keys them."""
    if isinstance(node, Group):
        doc: dict[str, Any] = _group_document(node)
        attrs = node.attrs.asdict()
    else:
        doc = json.loads(node.native.metadata_json)
        attrs = doc.get("attributes") or {}
        if isinstance(doc.get("codecs"), list):
            doc["codecs"] = _long_form(doc["codecs"])
    if zarr_format == 3:
        docs[prefix] = doc
        return
    kind = ".zgroup" if isinstance(node, Group) else ".zarray"
    base = f"{prefix}/" if prefix else ""
    docs[base + kind] = {k: v for k, v in doc.items() if k not in _V2_NOT_ZARRAY}
    if attrs:
        docs[base + ".zattrs"] = attrs


def _metadata_store(group: Group, nodes: Iterable[tuple[str, Array | Group]]) -> Any:
    """A zarr-python in-memory store holding ``group``'s consolidated metadata (of ``nodes``,
    relative paths) and no chunk."""
    import zarr
    from zarr.core.buffer import default_buffer_prototype

    fmt = group.zarr_format
    members: dict[str, Any] = {}
    for path, node in nodes:
        _add_documents(members, path, node, fmt)
    if fmt == 3:
        root = _group_document(group)
        root["consolidated_metadata"] = {
            "kind": "inline",
            "must_understand": False,
            "metadata": members,
        }
        raw = {"zarr.json": root}
    else:
        _add_documents(members, "", group, 2)
        raw = {
            ".zmetadata": {"zarr_consolidated_format": 1, "metadata": members},
            **{k: v for k, v in members.items() if "/" not in k},
        }
    buf = default_buffer_prototype().buffer
    data = {k: buf.from_bytes(json.dumps(v).encode()) for k, v in raw.items()}
    return _metadata_only_store_class()(data, read_only=True)


_METADATA_KEYS = frozenset(("zarr.json", ".zgroup", ".zarray", ".zattrs", ".zmetadata"))


@functools.cache
def _metadata_only_store_class() -> type:
    """zarr-python's ``MemoryStore`` that refuses to serve a chunk: were a value ever read
    through it instead of zcrop, it would silently be the fill value."""
    import zarr

    class MetadataOnlyStore(zarr.storage.MemoryStore):
        async def get(self, key: str, prototype: Any = None, byte_range: Any = None) -> Any:
            if key.rsplit("/", 1)[-1] not in _METADATA_KEYS:
                raise ZcropError(f"zcrop's xarray backend reads values with zcrop, not {key!r}")
            return await super().get(key, prototype, byte_range)

        async def get_partial_values(self, prototype: Any, key_ranges: Any) -> Any:
            raise ZcropError("zcrop's xarray backend reads values with zcrop")

    return MetadataOnlyStore


def _open_zarr_group(store: Any, zarr_format: int) -> Any:
    import zarr

    with warnings.catch_warnings():
        # zarr-python warns that v3 consolidated metadata is not in the spec yet: here it is
        # only a way to hand over documents zcrop read.
        warnings.simplefilter("ignore")
        return zarr.open_consolidated(store, mode="r", zarr_format=zarr_format)


def _open_kwargs(storage_options: Mapping[str, Any] | None, chunk_cache: Any) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if storage_options:
        out["storage_options"] = dict(storage_options)
    if chunk_cache is not None:
        out["chunk_cache"] = chunk_cache
    return out


def _walk(
    group: Group,
    prefix: str,
    drop: frozenset[str],
    recursive: bool,
    out: list[tuple[str, Array | Group]],
) -> None:
    """``(relative path, node)`` of ``group``'s members (nested ones if ``recursive``), opening
    each array; an array zcrop cannot read is an error naming it, unless in ``drop``."""
    for name, kind in group._member_kinds():
        path = f"{prefix}/{name}" if prefix else name
        if kind == "array" and (name in drop or path in drop):
            continue
        try:
            node = group[name]
        except UnsupportedError as e:
            raise UnsupportedError(
                f"variable {path!r} of {group.name or '/'}: {e}; "
                f"drop_variables=[{name!r}] opens the rest"
            ) from e
        out.append((path, node))
        if recursive and isinstance(node, Group):
            _walk(node, path, drop, recursive, out)


def _open_stores(
    filename_or_obj: Any,
    *,
    group: str | None,
    storage_options: Mapping[str, Any] | None,
    consolidated: bool | None,
    zarr_format: int | None,
    drop_variables: Iterable[str] | None,
    use_zarr_fill_value_as_mask: bool | None,
    chunk_cache: Any,
    recursive: bool,
    virtual_chunk_containers: Mapping[str, Any] | None = None,
) -> dict[str, ZcropStore]:
    """One :class:`ZcropStore` per group (``"/"``-rooted paths relative to the store's root):
    ``group`` alone, or it and every group below it when ``recursive``."""
    sub = (group or "").strip("/")
    if is_icechunk(filename_or_obj):
        snap = open_icechunk(filename_or_obj, storage_options=dict(storage_options or {}),
                             chunk_cache=chunk_cache,
                             virtual_chunk_containers=virtual_chunk_containers)
        root = snap.uri
        options = _open_kwargs(snap.storage_options, snap.chunk_cache)
        options["icechunk_snapshot"] = snap.snapshot_id
        if snap.virtual_chunk_containers:
            options["virtual_chunk_containers"] = snap.virtual_chunk_containers
        top = snap.group(sub)
    else:
        if virtual_chunk_containers:
            raise ValueError("virtual_chunk_containers= applies to Icechunk snapshots")
        root = (os.fspath(filename_or_obj) if isinstance(filename_or_obj, os.PathLike)
                else filename_or_obj)
        if not isinstance(root, str):
            raise TypeError(
                "engine='zcrop' opens a path or URL, a zcrop.IcechunkSnapshot or an "
                f"icechunk Session, got {type(filename_or_obj).__name__}"
            )
        options = _open_kwargs(storage_options, chunk_cache)
        top = _api.open_group(root, path=sub or None, zarr_format=zarr_format, **options)
    if consolidated and not top.metadata["consolidated"]:
        raise ValueError(f"{root}: no consolidated metadata (consolidated=True was asked for)")
    drop = frozenset(
        [drop_variables] if isinstance(drop_variables, str) else (drop_variables or ())
    )
    nodes: list[tuple[str, Array | Group]] = []
    _walk(top, "", drop, recursive, nodes)
    zroot = _open_zarr_group(_metadata_store(top, nodes), top.zarr_format)
    groups = {"": (top, zroot)}
    for path, node in nodes:
        if isinstance(node, Group):
            groups[path] = (node, zroot[path])
    stores = {}
    for path, (_, zg) in groups.items():
        prefix = f"{path}/" if path else ""
        arrays = {
            p[len(prefix) :]: n
            for p, n in nodes
            if isinstance(n, Array) and p.startswith(prefix) and "/" not in p[len(prefix) :]
        }
        full = "/" + "/".join(x for x in (sub, path) if x)
        stores[full] = ZcropStore(zg, arrays, (root, options), use_zarr_fill_value_as_mask)
    return stores


class ZcropBackendEntrypoint(BackendEntrypoint):
    """Opens Zarr v2 and v3 stores (local paths and object-store URLs) and Icechunk snapshots
    (a ``zcrop.IcechunkSnapshot``, an ``icechunk.Session`` or its store) with zcrop.

    ``xr.open_dataset(path, engine="zcrop", chunks=..., storage_options=..., group=...)``:
    the dataset ``xr.open_zarr`` gives (same variables, coordinates, attributes, encodings and
    CF decoding); zcrop reads the metadata and, lazily, the values.
    """

    description = (
        "Open Zarr stores (v2, v3, sharded; local or s3://, gs://, https://) and Icechunk "
        "snapshots with zcrop"
    )
    url = "https://github.com/zcrop/zcrop/blob/main/docs/python.md#xarray"
    supports_groups = True
    open_dataset_parameters = (
        "filename_or_obj",
        "mask_and_scale",
        "decode_times",
        "concat_characters",
        "decode_coords",
        "drop_variables",
        "use_cftime",
        "decode_timedelta",
        "group",
        "consolidated",
        "storage_options",
        "zarr_format",
        "use_zarr_fill_value_as_mask",
        "chunk_cache",
        "virtual_chunk_containers",
    )

    def guess_can_open(self, filename_or_obj: Any) -> bool:
        if isinstance(filename_or_obj, IcechunkSnapshot):
            return True
        if isinstance(filename_or_obj, os.PathLike):
            filename_or_obj = os.fspath(filename_or_obj)
        if not isinstance(filename_or_obj, str):
            return False
        path = filename_or_obj.rstrip("/")
        if path.endswith(".zarr"):
            return True
        if _api.is_url(path):
            return False
        return any(
            os.path.exists(os.path.join(path, doc))
            for doc in ("zarr.json", ".zgroup", ".zarray", ".zmetadata")
        )

    def open_dataset(
        self,
        filename_or_obj: Any,
        *,
        mask_and_scale: bool = True,
        decode_times: Any = True,
        concat_characters: bool = True,
        decode_coords: Any = True,
        drop_variables: str | Iterable[str] | None = None,
        use_cftime: bool | None = None,
        decode_timedelta: Any = None,
        group: str | None = None,
        consolidated: bool | None = None,
        storage_options: Mapping[str, Any] | None = None,
        zarr_format: int | None = None,
        use_zarr_fill_value_as_mask: bool | None = None,
        chunk_cache: Any = None,
        virtual_chunk_containers: Mapping[str, Any] | None = None,
    ) -> xr.Dataset:
        decode = dict(
            mask_and_scale=mask_and_scale,
            decode_times=decode_times,
            concat_characters=concat_characters,
            decode_coords=decode_coords,
            use_cftime=use_cftime,
            decode_timedelta=decode_timedelta,
        )
        opened = self.open_groups_as_dict(
            filename_or_obj,
            drop_variables=drop_variables,
            group=group,
            consolidated=consolidated,
            storage_options=storage_options,
            zarr_format=zarr_format,
            use_zarr_fill_value_as_mask=use_zarr_fill_value_as_mask,
            chunk_cache=chunk_cache,
            virtual_chunk_containers=virtual_chunk_containers,
            _recursive=False,
            **decode,
        )
        return opened["/"]

    def open_groups_as_dict(
        self,
        filename_or_obj: Any,
        *,
        drop_variables: str | Iterable[str] | None = None,
        group: str | None = None,
        consolidated: bool | None = None,
        storage_options: Mapping[str, Any] | None = None,
        zarr_format: int | None = None,
        use_zarr_fill_value_as_mask: bool | None = None,
        chunk_cache: Any = None,
        virtual_chunk_containers: Mapping[str, Any] | None = None,
        _recursive: bool = True,
        **decode: Any,
    ) -> dict[str, xr.Dataset]:
        """Each group at and below ``group`` as a Dataset, keyed by its path relative to
        ``group`` (``"/"`` for itself); ``decode`` holds the CF-decoding options of
        :meth:`open_dataset`."""
        stores = _open_stores(
            filename_or_obj,
            group=group,
            storage_options=storage_options,
            consolidated=consolidated,
            zarr_format=zarr_format,
            drop_variables=drop_variables,
            use_zarr_fill_value_as_mask=use_zarr_fill_value_as_mask,
            chunk_cache=chunk_cache,
            recursive=_recursive,
            virtual_chunk_containers=virtual_chunk_containers,
        )
        parent = "/" + (group or "").strip("/")
        out = {}
        for path, store in stores.items():
            ds = StoreBackendEntrypoint().open_dataset(
                store, drop_variables=drop_variables, **decode
            )
            rel = path[len(parent) :].strip("/") if path.startswith(parent) else path
            out["/" + rel if rel else "/"] = ds
        return out

    def open_datatree(self, filename_or_obj: Any, **kwargs: Any) -> xr.DataTree:
        return xr.DataTree.from_dict(self.open_groups_as_dict(filename_or_obj, **kwargs))


def open_dataset(store: Any, **kwargs: Any) -> xr.Dataset:
    """``xr.open_dataset(store, engine="zcrop", **kwargs)``: a Zarr store as an xarray Dataset,
    lazily read by zcrop (``chunks={}`` for dask arrays chunked as the store is)."""
    return xr.open_dataset(store, engine="zcrop", **kwargs)


def open_datatree(store: Any, **kwargs: Any) -> xr.DataTree:
    """``xr.open_datatree(store, engine="zcrop", **kwargs)``: every group of a Zarr store."""
    return xr.open_datatree(store, engine="zcrop", **kwargs)



#: xarray's wrappers that only cache or protect what they hold; skipped when replaying decoding.
_PASSIVE_WRAPPERS = (indexing.MemoryCachedArray, indexing.CopyOnWriteArray)


def _source(var: xr.Variable, name: str) -> tuple[ZcropBackendArray | None, list[Any]]:
    """The zcrop array under an unindexed lazily loaded variable and xarray's decoding wrappers
    above it (outermost first); ``(None, [])`` for a variable already in memory."""
    data = var._data
    if hasattr(data, "chunks") and not isinstance(data, indexing.ExplicitlyIndexed):
        raise TypeError(
            f"variable {name!r} is a dask array: open the dataset with chunks=None "
            "(the default of xr.open_dataset) to read windows"
        )
    chain: list[Any] = []
    while not isinstance(data, indexing.LazilyIndexedArray):
        if isinstance(data, np.ndarray | indexing.NumpyIndexingAdapter | indexing.PandasIndexingAdapter):
            return None, []  # loaded (values are read from memory; decoding is done)
        if not isinstance(data, indexing.ExplicitlyIndexed) or not hasattr(data, "array"):
            raise TypeError(f"variable {name!r} is not backed by engine='zcrop'")
        if not isinstance(data, _PASSIVE_WRAPPERS):
            chain.append(data)
        data = data.array
    key = data.key.tuple
    if any(k != slice(None) for k in key) or not isinstance(data.array, ZcropBackendArray):
        raise TypeError(
            f"variable {name!r} is not a whole variable of a dataset opened with "
            "engine='zcrop': pass the dataset as opened, before isel/sel"
        )
    return data.array, chain


def _decoded(raw: np.ndarray[Any, Any], chain: list[Any]) -> Any:
    """``raw`` (stored values) through the same CF decoding xarray applies to the variable."""
    from xarray.coding.common import _ElementwiseFunctionArray

    data: Any = indexing.NumpyIndexingAdapter(raw)  # type: ignore[no-untyped-call]
    for wrapper in reversed(chain):
        if isinstance(wrapper, _ElementwiseFunctionArray):
            data = _ElementwiseFunctionArray(data, wrapper.func, wrapper.dtype)
        else:
            data = type(wrapper)(data)
    return np.asarray(data.get_duck_array())


def read_windows(
    ds: xr.Dataset,
    starts: Mapping[str, Any],
    sizes: Mapping[str, int],
    *,
    variables: Iterable[str] | None = None,
    as_numpy: bool = False,
) -> Any:
    """Reads N windows of every variable of ``ds`` (opened with ``engine="zcrop"``): window
    ``i`` starts at ``starts[dim][i]`` (integer positions) and spans ``sizes[dim]`` along each
    dimension named there, and the whole of the other dimensions.

    All variables' windows are one planned batch (each chunk read and decoded once however
    many windows share it; the reads of all variables go out in one submission), and values
    are CF-decoded as xarray decodes the variable. Returns a Dataset with a leading
    ``sample`` dimension: each windowed dimension ``d`` keeps its name and gains the
    coordinates ``d + "_start"`` (sample,) and, where ``ds`` has a coordinate ``d``,
    ``d + "_labels"`` (sample, d). ``as_numpy=True`` returns ``{name: array}`` instead.
    Variables with none of the windowed dimensions are returned once, not per sample.
    """
    unknown = [d for d in list(starts) + list(sizes) if d not in ds.dims]
    if unknown:
        raise KeyError(f"dimensions {unknown} are not in the dataset (it has {list(ds.dims)})")
    if set(starts) != set(sizes):
        raise ValueError(
            f"starts and sizes must name the same dimensions, got {sorted(starts)} and "
            f"{sorted(sizes)}"
        )
    origin = {d: np.asarray(v, dtype=np.int64).reshape(-1) for d, v in starts.items()}
    counts = {len(v) for v in origin.values()}
    if len(counts) > 1:
        raise ValueError(f"every dimension needs one start per window, got {counts}")
    n = counts.pop() if counts else 1
    for d, o in origin.items():
        size = int(sizes[d])
        if size < 1 or size > ds.sizes[d] or (o < 0).any() or (o + size > ds.sizes[d]).any():
            raise IndexError(
                f"windows of {size} along {d!r} (length {ds.sizes[d]}) must start in "
                f"[0, {ds.sizes[d] - size}]"
            )
    names = [str(v) for v in (variables if variables is not None else ds.data_vars)]

    results: dict[str, tuple[tuple[Hashable, ...], Any]] = {}
    reads: list[tuple[Array, Any, list[int]]] = []
    decode: list[tuple[str, tuple[Hashable, ...], list[Any]]] = []
    for name in names:
        var = ds[name].variable
        if not any(d in origin for d in var.dims):
            results[name] = (var.dims, None)
            continue
        array, chain = _source(var, name)
        if array is None:
            values = var.values
            windows = [
                values[
                    tuple(
                        slice(origin[d][i], origin[d][i] + sizes[d]) if d in origin else slice(None)
                        for d in var.dims
                    )
                ]
                for i in range(n)
            ]
            results[name] = (var.dims, np.stack(windows))
            continue
        crop = [int(sizes[d]) if d in origin else int(s) for d, s in zip(var.dims, var.shape)]
        origins = np.stack(
            [origin[d] if d in origin else np.zeros(n, np.int64) for d in var.dims], axis=-1
        ).astype(np.uint64)
        reads.append((array._array, origins.reshape(n, len(var.dims)), crop))
        decode.append((name, var.dims, chain))
    # Every variable's windows in one batch: from an object store, one set of round trips.
    for (name, dims, chain), raw in zip(decode, read_crops_many(reads), strict=True):
        results[name] = (dims, _decoded(raw, chain))
    if as_numpy:
        return {
            name: (ds[name].values if out is None else out) for name, (_, out) in results.items()
        }
    data_vars = {
        name: (
            ds[name].variable
            if out is None
            else xr.Variable(("sample", *dims), out, ds[name].attrs)
        )
        for name, (dims, out) in results.items()
    }
    coords: dict[str, Any] = {}
    for d, o in origin.items():
        coords[f"{d}_start"] = ("sample", o)
        if d in ds.coords:
            labels = ds[d].values
            coords[f"{d}_labels"] = (("sample", d), labels[o[:, None] + np.arange(sizes[d])])
    for cname, c in ds.coords.items():
        if not set(c.dims) & set(origin) and cname not in coords:
            coords[str(cname)] = c.variable
    return xr.Dataset(data_vars, coords=coords, attrs=ds.attrs)
