"""Opening stores: ``zcrop.open``, ``open_array``, ``open_group`` and ``open_async``.

They take the arguments of zarr-python's functions of the same names that make sense for
reading, so ``zarr.open(path)`` becomes ``zcrop.open(path)``. A store is a local path or the
URL of one in an object store (``s3://bucket/data.zarr``, ``gs://``, ``az://``, ``https://``),
configured like fsspec or obstore stores with ``storage_options``
(``{"endpoint_url": ..., "region": ..., "anon": True, "key": ..., "secret": ...}``).

Deadlines: a request that gets no response within ``timeout`` (default ``"30s"``) fails and
is retried, with backoff, until ``retry_timeout`` seconds (default 60) have passed since its
first try; a read from a server that stops answering therefore raises
:class:`~zcrop.errors.StoreError` within about 90 seconds. ``storage_options={"timeout": "5s",
"retry_timeout": 10}`` fails sooner; ``max_retries`` (default 10) bounds the tries. An
unknown or malformed storage option is an :class:`~zcrop.errors.InvalidArgumentError`.

Decoded chunks go to one cache per process that every array shares (256 MiB, or
``ZCROP_CHUNK_CACHE``). ``chunk_cache=`` (bytes, or a size such as ``"512M"``) gives the arrays
opened a cache of their own of that budget instead; ``chunk_cache=0`` none.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any

from zcrop import _zcrop
from zcrop._zcrop import NativeArray, NativeGroup
from zcrop._array import Array, AsyncArray, await_native
from zcrop._group import AsyncGroup, Group, wrap, wrap_async
from zcrop.errors import InvalidArgumentError, NodeNotFoundError, NodeTypeError

__all__ = ["open", "open_array", "open_async", "open_group"]

_READ_MODES = ("r", "r+", "a")


#: A storage options mapping as the native side takes it: ``(key, value)`` text pairs.
Options = list[tuple[str, str]]

#: Keyword arguments of the native open functions (``storage_options``, ``chunk_cache``).
OpenArgs = dict[str, Any]


def is_url(root: str) -> bool:
    """Whether ``root`` is an object-store URL (``s3://``, ``https://``, ...), not a path."""
    scheme, sep, _ = root.partition("://")
    return bool(sep) and scheme.lower() != "file" and scheme.replace("+", "").replace(
        "-", ""
    ).replace(".", "").isalnum()


def storage_option_pairs(storage_options: Any) -> Options | None:
    """``storage_options`` (a mapping) as ``(key, value)`` text pairs; booleans as
    ``"true"``/``"false"``. ``None`` for none."""
    if storage_options is None:
        return None
    if not isinstance(storage_options, Mapping):
        raise TypeError(f"storage_options must be a mapping, got {type(storage_options)!r}")
    pairs: Options = []
    for key, value in storage_options.items():
        if isinstance(value, bool):
            text = "true" if value else "false"
        elif isinstance(value, (str, int, float)):
            text = str(value)
        else:
            raise TypeError(
                f"storage option {key!r}: zcrop takes text, numbers and booleans, "
                f"got {type(value)!r}"
            )
        pairs.append((str(key), text))
    return pairs


def _store_path(store: Any, mode: str | None, kwargs: dict[str, Any]) -> tuple[str, OpenArgs]:
    """The directory or URL to open and the native open function's keyword arguments
    (storage options, chunk cache), from zarr-python style arguments."""
    if mode is not None and mode not in _READ_MODES:
        raise ValueError(
            f"zcrop opens stores for reading; mode {mode!r} would create or overwrite data "
            f"(use one of {', '.join(map(repr, _READ_MODES))})"
        )
    options = storage_option_pairs(kwargs.pop("storage_options", None))
    chunk_cache = kwargs.pop("chunk_cache", None)
    kwargs.pop("use_consolidated", None)  # consolidated metadata is used when present
    if kwargs:
        raise TypeError(f"unexpected keyword arguments: {', '.join(sorted(kwargs))}")
    if store is None:
        raise TypeError("a store (a local path or a URL) is required")
    if isinstance(store, (str, os.PathLike)):
        root = os.fspath(store)
    elif hasattr(store, "root"):  # zarr.storage.LocalStore
        root = os.fspath(store.root)
    else:
        raise TypeError(f"zcrop reads stores given as a path or a URL; got {type(store)!r}")
    if isinstance(root, bytes):
        root = os.fsdecode(root)
    if root.startswith("file://"):
        root = root[len("file://") :]
    if options and not is_url(root):
        raise InvalidArgumentError(
            f"storage_options apply to object-store URLs (s3://, gs://, az://, https://); "
            f"{root!r} is a local path"
        )
    return root, {"storage_options": options or None, "chunk_cache": chunk_cache}


def _join(root: str, sub: str) -> str:
    return f"{root.rstrip('/')}/{sub}" if is_url(root) else os.path.join(root, sub)


def _open_native(root: str, path: str | None, options: OpenArgs) -> NativeArray | NativeGroup:
    """Opens ``path`` inside the store at ``root``: through the root group when there is one
    (so names are store paths, ``/group/array``), else the sub-directory itself."""
    sub = (path or "").strip("/")
    if not sub:
        return _zcrop.open_node(root, **options)
    try:
        top = _zcrop.open_node(root, **options)
    except NodeNotFoundError:
        top = None
    if isinstance(top, NativeGroup):
        return top.get(sub)
    return _zcrop.open_node(_join(root, sub), **options)


async def _open_native_async(
    root: str, path: str | None, options: OpenArgs
) -> NativeArray | NativeGroup:
    """:func:`_open_native` on zcrop's threads."""
    submit_open = functools.partial(_zcrop.submit_open, **options)
    sub = (path or "").strip("/")
    if not sub:
        return await await_native(submit_open, root)  # type: ignore[no-any-return]
    try:
        top = await await_native(submit_open, root)
    except NodeNotFoundError:
        top = None
    if isinstance(top, NativeGroup):
        return await await_native(top.submit_get, sub)  # type: ignore[no-any-return]
    return await await_native(submit_open, _join(root, sub))  # type: ignore[no-any-return]


def _check_format(node: Any, zarr_format: int | None, where: str) -> None:
    if zarr_format is not None and int(node.zarr_format) != int(zarr_format):
        raise NodeNotFoundError(f"no Zarr v{zarr_format} array or group at {where}")


def open(
    store: Any = None,
    *,
    mode: str | None = None,
    path: str | None = None,
    zarr_format: int | None = None,
    zarr_version: int | None = None,
    **kwargs: Any,
) -> Array | Group:
    """Opens the array or group at ``store`` (a local path or a URL such as
    ``s3://bucket/data.zarr``, with ``storage_options=`` for it; ``path`` joins a sub-path).
    ``chunk_cache=`` gives the arrays a decoded-chunk cache of their own of that many bytes (or
    a size such as ``"512M"``; ``0``: none) instead of the process-wide one.

    Raises :class:`FileNotFoundError` (:class:`zcrop.NodeNotFoundError`) when there is none.
    ``mode`` may be ``"r"``, ``"r+"`` or ``"a"``: zcrop only reads.
    """
    where, options = _store_path(store, mode, kwargs)
    node = _open_native(where, path, options)
    _check_format(node, zarr_format or zarr_version, where)
    return wrap(node)


def open_array(
    store: Any = None,
    *,
    mode: str | None = None,
    path: str | None = None,
    zarr_format: int | None = None,
    zarr_version: int | None = None,
    **kwargs: Any,
) -> Array:
    """Opens the array at ``store``; a group there raises :class:`zcrop.NodeTypeError`."""
    where, options = _store_path(store, mode, kwargs)
    node = wrap(_open_native(where, path, options))
    if not isinstance(node, Array):
        raise NodeTypeError(f"{where} is a Zarr group, not an array")
    _check_format(node, zarr_format or zarr_version, where)
    return node


def open_group(
    store: Any = None,
    *,
    mode: str | None = None,
    path: str | None = None,
    zarr_format: int | None = None,
    zarr_version: int | None = None,
    **kwargs: Any,
) -> Group:
    """Opens the group at ``store``; an array there raises :class:`zcrop.NodeTypeError`."""
    where, options = _store_path(store, mode, kwargs)
    node = wrap(_open_native(where, path, options))
    if not isinstance(node, Group):
        raise NodeTypeError(f"{where} is a Zarr array, not a group")
    _check_format(node, zarr_format or zarr_version, where)
    return node


async def open_async(
    store: Any = None,
    *,
    mode: str | None = None,
    path: str | None = None,
    zarr_format: int | None = None,
    zarr_version: int | None = None,
    **kwargs: Any,
) -> AsyncArray | AsyncGroup:
    """:func:`open` for asyncio: ``await zcrop.open_async(path)`` gives an
    :class:`AsyncArray` or :class:`AsyncGroup`. Opening runs on zcrop's threads."""
    where, options = _store_path(store, mode, kwargs)
    node = wrap_async(await _open_native_async(where, path, options))
    _check_format(node, zarr_format or zarr_version, where)
    return node


def chunk_cache_info() -> dict[str, int]:
    """The process-wide decoded-chunk cache that arrays opened without ``chunk_cache=`` share:
    ``{"budget": bytes, "used": bytes}`` (both 0 where ``ZCROP_CHUNK_CACHE=0`` turned it off).
    Each process (a ``DataLoader`` worker, say) has its own. Raises
    :class:`~zcrop.errors.InvalidArgumentError` where ``ZCROP_CHUNK_CACHE`` does not parse."""
    usage = _zcrop.chunk_cache_usage()
    used, budget = usage if usage is not None else (0, 0)
    return {"budget": budget, "used": used}
