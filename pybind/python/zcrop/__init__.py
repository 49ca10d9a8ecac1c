"""zcrop: fast random N-d crops from huge Zarr arrays, to feed GPU/TPU training.

The read API mirrors zarr-python's, so ``import zarr`` -> ``import zcrop as zarr`` is enough for
reading code::

    import zcrop

    arr = zcrop.open("weather.zarr/temperature")
    block = arr[0, :, 100:228, 200:328]          # numpy array, zarr-python's dtype and values
    crops = arr.read_crops([[0, 0, 0, 0], [3, 2, 64, 64]], (4, 3, 128, 128))  # one planned batch

Async: ``arr = await zcrop.open_async(path)``, ``await arr.getitem(sel)``,
``await arr.read_crops(origins, shape)``.

xarray: ``xr.open_dataset(path, engine="zcrop")`` (or ``zcrop.open_dataset(path)``) opens a Zarr
store as the Dataset ``xr.open_zarr`` gives, read by zcrop.

Errors: see :mod:`zcrop.errors` (every zcrop error is a :class:`ZcropError` and also the builtin
type plain ``except`` clauses expect).
"""

from typing import Any

from zcrop._api import chunk_cache_info, open, open_array, open_async, open_group
from zcrop._array import Array, ArrayMetadata, AsyncArray, Attributes
from zcrop._group import AsyncGroup, Group
from zcrop._icechunk import IcechunkSnapshot, open_icechunk
from zcrop._fields import ValidMask
from zcrop._loader import Dim, Loader, Samples, Source
from zcrop._valid import valid_windows
from zcrop._zcrop import __version__
from zcrop.errors import (
    BoundsError,
    CancelledError,
    CodecError,
    InternalError,
    InvalidArgumentError,
    LoaderError,
    MetadataError,
    NodeNotFoundError,
    NodeTypeError,
    OutOfMemoryError,
    ShardIndexError,
    StoreError,
    TransformError,
    UnsupportedError,
    ZcropError,
)

__all__ = [
    "Array",
    "ArrayMetadata",
    "AsyncArray",
    "AsyncGroup",
    "Attributes",
    "BoundsError",
    "CancelledError",
    "CodecError",
    "Dim",
    "Group",
    "IcechunkSnapshot",
    "InternalError",
    "InvalidArgumentError",
    "Loader",
    "LoaderError",
    "MetadataError",
    "NodeNotFoundError",
    "NodeTypeError",
    "OutOfMemoryError",
    "Samples",
    "ShardIndexError",
    "Source",
    "StoreError",
    "TransformError",
    "UnsupportedError",
    "ValidMask",
    "ZcropError",
    "__version__",
    "chunk_cache_info",
    "open",
    "open_array",
    "open_async",
    "open_dataset",
    "open_icechunk",
    "open_datatree",
    "open_group",
    "read_windows",
    "valid_windows",
]

#: Names served by modules that need optional packages (xarray), imported on first use.
_LAZY = {
    "open_dataset": "zcrop._xarray",
    "open_datatree": "zcrop._xarray",
    "read_windows": "zcrop._xarray",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'zcrop' has no attribute {name!r}")
