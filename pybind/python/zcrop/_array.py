"""``zcrop.Array`` and ``zcrop.AsyncArray``: zarr-python's read API over zcrop's reader.

Both classes wrap one native handle and share their metadata properties; the sync methods call
the native reader through its blocking helper (GIL released, Ctrl-C honoured), the async
methods through its background threads. Either way the same Rust read runs.

Result buffers: a read allocates its result in Rust and hands it to numpy without copying; the
returned array owns that memory (numpy frees it through Rust when the last reference goes), so
it has no lifetime rule beyond ordinary numpy arrays. With ``out=`` the read writes straight
into the caller's array instead.
"""

from __future__ import annotations

import asyncio
import json
import math
from collections.abc import Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import numpy.typing as npt

from zcrop import _indexing, _zcrop
from zcrop._zcrop import NativeArray, NativeGroup, Pending
from zcrop.errors import BoundsError

if TYPE_CHECKING:
    from zcrop._indexing import Coordinates, Orthogonal

__all__ = ["Array", "ArrayMetadata", "AsyncArray", "Attributes"]

_NATIVE_ORDER = "<" if np.little_endian else ">"


class Attributes(Mapping[str, Any]):
    """The user attributes of an array or group: a read-only mapping of JSON values."""

    __slots__ = ("_data",)

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def asdict(self) -> dict[str, Any]:
        """The attributes as a new ``dict``."""
        copy: dict[str, Any] = json.loads(json.dumps(self._data))
        return copy

    def __repr__(self) -> str:
        return f"Attributes({self._data!r})"


class ArrayMetadata(Mapping[str, Any]):
    """An array's metadata as stored (``zarr.json``, or ``.zarray`` with its attributes).

    A read-only mapping; keys are also readable as attributes (``meta.shape``), and
    ``to_dict()`` returns a plain ``dict`` like zarr-python's metadata objects.
    """

    __slots__ = ("_data",)

    def __init__(self, data: dict[str, Any]) -> None:
        self._data = data

    def __getitem__(self, key: str) -> Any:
        return self._data[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)

    def __getattr__(self, name: str) -> Any:
        try:
            return self._data[name]
        except KeyError:
            raise AttributeError(name) from None

    def to_dict(self) -> dict[str, Any]:
        """The metadata as a new ``dict``."""
        copy: dict[str, Any] = json.loads(json.dumps(self._data))
        return copy

    def __repr__(self) -> str:
        return f"ArrayMetadata({self._data!r})"


def _out_array(out: Any) -> npt.NDArray[Any]:
    """The numpy array behind an ``out=`` argument (a numpy array or a zarr ``NDBuffer``)."""
    if not isinstance(out, np.ndarray) and hasattr(out, "as_ndarray_like"):
        out = out.as_ndarray_like()
    if not isinstance(out, np.ndarray):
        raise TypeError(f"out must be a numpy array, got {type(out)!r}")
    return out


def _variable_dtype(kind: str | None) -> np.dtype[Any] | None:
    """The dtype zarr-python gives variable-length elements: numpy's ``StringDType`` for text
    (``object`` before numpy 2), ``object`` for bytes; ``None`` for fixed-size elements."""
    if kind == "utf8" and hasattr(np.dtypes, "StringDType"):
        return np.dtype(np.dtypes.StringDType())
    return np.dtype(object) if kind else None


def _variable_box(dims: Sequence[Any]) -> tuple[list[int], list[int], list[Any]]:
    """The box an orthogonal selection of a variable-length array reads (its bounding box:
    such arrays are read whole chunks at a time), and each dimension's index into it."""
    origin: list[int] = []
    shape: list[int] = []
    local: list[Any] = []
    for d in dims:
        if isinstance(d, tuple):
            origin.append(int(d[0]))
            shape.append(int(d[1]))
            local.append(None)
        else:
            idx = np.asarray(d, dtype=np.int64)
            lo = int(idx.min()) if idx.size else 0
            origin.append(lo)
            shape.append(int(idx.max()) - lo + 1 if idx.size else 0)
            local.append(idx - lo)
    return origin, shape, local


def _variable_orthogonal(native: NativeArray, dtype: np.dtype[Any], sel: Orthogonal) -> Any:
    """An orthogonal selection of a variable-length array."""
    origin, shape, local = _variable_box(sel.dims)
    box = np.array(native.read_variable(origin, shape), dtype=dtype).reshape(shape)
    for axis, idx in enumerate(local):
        if idx is not None:
            box = np.take(box, idx, axis=axis)
    return box.reshape(sel.shape)


def _variable_points(native: NativeArray, dtype: np.dtype[Any], sel: Coordinates) -> Any:
    """A coordinate selection of a variable-length array."""
    coords = np.asarray(sel.coords, dtype=np.int64).reshape(-1, len(native.shape))
    if coords.shape[0] == 0:
        return np.empty(sel.shape, dtype=dtype)
    lo = coords.min(axis=0)
    shape = coords.max(axis=0) - lo + 1
    box = np.array(native.read_variable(lo.tolist(), shape.tolist()), dtype=dtype)
    box = box.reshape(tuple(shape.tolist()))
    return box[tuple((coords - lo).T)].reshape(sel.shape)


def _into(out: Any, result: Any) -> Any:
    """Copies a variable-length result into a caller's ``out`` array."""
    out = _out_array(out)
    if out.shape != result.shape:
        raise ValueError(f"out has shape {out.shape}, the selection {result.shape}")
    out[...] = result
    return out


class _Node:
    """What arrays and groups share: the native handle, and its name, path, format and
    attributes."""

    __slots__ = ("_attrs", "_native", "__weakref__")

    _native: NativeArray | NativeGroup
    _attrs: Attributes | None

    @property
    def name(self) -> str:
        """The node's path in its store, ``/``-rooted (``/`` for the root)."""
        return str(self._native.name)

    @property
    def path(self) -> str:
        """The node's path relative to the store root (``""`` for the root)."""
        return str(self._native.path)

    @property
    def basename(self) -> str:
        """The last part of :attr:`name` (``""`` for the root)."""
        return self.name.rsplit("/", 1)[-1]

    @property
    def zarr_format(self) -> int:
        """2 or 3."""
        return int(self._native.zarr_format)

    @property
    def attrs(self) -> Attributes:
        """The user attributes (read-only)."""
        if self._attrs is None:
            self._attrs = Attributes(json.loads(self._native.attributes_json))
        return self._attrs

    @property
    def read_only(self) -> bool:
        """Always ``True``: zcrop reads."""
        return True


class _ArrayBase(_Node):
    """What ``Array`` and ``AsyncArray`` share: the native handle, metadata, result views."""

    __slots__ = ("_dtype", "_meta", "_native_dtype", "_shape", "_swap")

    _native: NativeArray

    def __init__(self, native: NativeArray) -> None:
        self._native = native
        self._shape = tuple(int(n) for n in native.shape)
        self._dtype = _variable_dtype(native.variable_kind) or np.dtype(native.numpy_dtype)
        self._native_dtype = self._dtype if native.variable_kind else self._dtype.newbyteorder("=")
        self._swap = self._dtype.byteorder not in ("=", "|", _NATIVE_ORDER)
        self._attrs = None
        self._meta: ArrayMetadata | None = None

    # --- metadata ---------------------------------------------------------------------------

    @property
    def shape(self) -> tuple[int, ...]:
        """The array's shape."""
        return self._shape

    @property
    def dtype(self) -> np.dtype[Any]:
        """The numpy dtype zarr-python reports (a v2 big-endian array stays big-endian)."""
        return self._dtype

    @property
    def chunks(self) -> tuple[int, ...]:
        """The chunk shape zarr-python reports: the inner chunks of a sharded array (of the
        outer shard level when shards nest)."""
        if self.shards is not None:
            for codec in self.metadata.get("codecs") or ():
                if isinstance(codec, dict) and codec.get("name") == "sharding_indexed":
                    return tuple(int(n) for n in codec["configuration"]["chunk_shape"])
        return tuple(int(n) for n in self._native.chunk_shape)

    @property
    def shards(self) -> tuple[int, ...] | None:
        """The shard shape of a sharded array, else ``None``."""
        s = self._native.shard_shape
        return None if s is None else tuple(int(n) for n in s)

    @property
    def ndim(self) -> int:
        """Number of dimensions."""
        return len(self._shape)

    @property
    def size(self) -> int:
        """Number of elements."""
        return math.prod(self._shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the whole array in memory (``size * itemsize``)."""
        return self.size * self._dtype.itemsize

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return self._dtype.itemsize

    @property
    def cdata_shape(self) -> tuple[int, ...]:
        """The number of chunks along each dimension."""
        return tuple(math.ceil(s / c) for s, c in zip(self._shape, self.chunks))

    @property
    def nchunks(self) -> int:
        """The number of chunks in the array."""
        return math.prod(self.cdata_shape)

    @property
    def metadata(self) -> ArrayMetadata:
        """The metadata as stored (see :class:`ArrayMetadata`)."""
        if self._meta is None:
            self._meta = ArrayMetadata(json.loads(self._native.metadata_json))
        return self._meta

    @property
    def fill_value(self) -> Any:
        """The fill value, a numpy scalar of the dtype (``None`` for a v2 ``null`` fill)."""
        if self.zarr_format == 2 and self.metadata.get("fill_value") is None:
            return None
        if self._native.variable_kind == "utf8":
            return self._native.fill_value_bytes.decode()
        if self._native.variable_kind:
            return self._native.fill_value_bytes
        return np.frombuffer(self._native.fill_value_bytes, dtype=self._native_dtype)[0]

    @property
    def order(self) -> str:
        """The memory order of stored chunks: ``"C"`` or ``"F"`` (v2 only; v3 is ``"C"``).
        Results are always C-contiguous."""
        return str(self.metadata.get("order", "C")) if self.zarr_format == 2 else "C"

    @property
    def dimension_names(self) -> tuple[str | None, ...] | None:
        """The v3 dimension names, if set."""
        names = self._native.dimension_names
        return None if names is None else tuple(names)

    @property
    def native(self) -> NativeArray:
        """The native handle (shared by every view of this array)."""
        return self._native

    def __len__(self) -> int:
        if not self._shape:
            raise TypeError("len() of unsized object")
        return self._shape[0]

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} shape={self._shape} dtype={self._dtype}>"

    # --- results ------------------------------------------------------------------------------

    def _view(self, result: tuple[npt.NDArray[np.uint64], int], shape: tuple[int, ...]) -> Any:
        """Gives a native result its dtype and shape, without copying (byte-swapped in place
        for a non-native dtype)."""
        words, nbytes = result
        arr = words.view(np.uint8)[:nbytes].view(self._native_dtype).reshape(shape)
        if self._swap:
            arr.byteswap(inplace=True)
            arr = arr.view(self._dtype)
        return arr

    def _out_bytes(self, out: Any, shape: tuple[int, ...]) -> npt.NDArray[Any]:
        """Checks an ``out=`` array; returns it."""
        arr = _out_array(out)
        return self._check_out(arr, shape)

    def _check_out(self, out: npt.NDArray[Any], shape: tuple[int, ...]) -> npt.NDArray[Any]:
        if out.shape != shape:
            raise ValueError(
                f"shape of out argument doesn't match. Expected {shape}, got {out.shape}"
            )
        if out.dtype not in (self._dtype, self._native_dtype):
            raise ValueError(f"out has dtype {out.dtype}, the array has {self._dtype}")
        if not out.flags.c_contiguous:
            raise ValueError("out must be C-contiguous")
        if not out.flags.writeable:
            raise ValueError("out must be writable")
        return out

    def _after_out(self, out: npt.NDArray[Any]) -> None:
        if out.dtype.byteorder not in ("=", "|", _NATIVE_ORDER):
            out.view(self._native_dtype).byteswap(inplace=True)


def _scalar(result: Any) -> Any:
    return result[()]


class _Indexer:
    """``arr.oindex`` / ``arr.vindex`` / ``arr.blocks``: ``[...]`` calls one method."""

    __slots__ = ("_get",)

    def __init__(self, get: Callable[[Any], Any]) -> None:
        self._get = get

    def __getitem__(self, selection: Any) -> Any:
        return self._get(selection)


def _block_selection(selection: Any, shape: tuple[int, ...], chunks: tuple[int, ...]) -> Any:
    """A block selection (chunk indices, zarr's ``BlockIndexer``) as a basic selection."""
    sel = _indexing.replace_lists(_indexing.replace_ellipsis(selection, shape))
    out = []
    for s, n, c in zip(sel, shape, chunks):
        nblocks = math.ceil(n / c)
        if _indexing.is_integer(s):
            b = int(s)
            if b < 0:
                b += nblocks
            start, stop = b * c, b * c + c
        elif isinstance(s, slice):
            if s.step not in (1, None):
                raise IndexError(
                    "unsupported selection item for block indexing; "
                    f"expected integer or slice with step=1, got {type(s)!r}"
                )
            b0 = 0 if s.start is None else s.start
            b1 = nblocks if s.stop is None else s.stop
            if b0 < 0:
                b0 += nblocks
            if b1 < 0:
                b1 += nblocks
            start, stop = b0 * c, b1 * c
        else:
            raise IndexError(
                "unsupported selection item for block indexing; "
                f"expected integer or slice, got {type(s)!r}"
            )
        if start >= n or start < 0:
            raise BoundsError(f"index out of bounds for dimension with length {n}")
        out.append(slice(start, stop))
    return tuple(out)


class Array(_ArrayBase):
    """A Zarr array opened for reading, with zarr-python's read API.

    ``arr[...]``, :meth:`get_basic_selection`, :meth:`get_orthogonal_selection` (``.oindex``),
    :meth:`get_coordinate_selection` and :meth:`get_mask_selection` (``.vindex``) and
    :meth:`get_block_selection` (``.blocks``) return numpy arrays with the dtype and values
    zarr-python returns; :meth:`read_crops` reads a batch of crops as one planned read.
    Every read releases the GIL; Ctrl-C interrupts a long one.
    """

    __slots__ = ()

    def __getitem__(self, selection: Any) -> Any:
        """Reads a selection, dispatched like zarr-python: pure integer-array indexing is a
        coordinate selection, integer arrays mixed with slices an orthogonal one, the rest a
        basic selection."""
        pure = _indexing.pop_fields(selection)
        if _indexing.is_pure_fancy_indexing(pure, self.ndim):
            return self.vindex[pure]
        if _indexing.is_pure_orthogonal_indexing(pure, self.ndim):
            return self.get_orthogonal_selection(pure)
        return self.get_basic_selection(pure)

    def __array__(self, dtype: Any = None, copy: bool | None = None) -> npt.NDArray[Any]:
        a = np.asarray(self.get_basic_selection(Ellipsis))
        return a if dtype is None else np.asarray(a.astype(dtype, copy=False))

    def _read(self, sel: Orthogonal, out: Any) -> Any:
        if self._native.variable_kind:
            result = _variable_orthogonal(self._native, self._dtype, sel)
            return result if out is None else _into(out, result)
        if out is None:
            return self._view(self._native.read([sel.dims]), sel.shape)
        arr = self._out_bytes(out, sel.shape)
        self._native.read([sel.dims], arr.reshape(-1).view(np.uint8))
        self._after_out(arr)
        return arr

    def _read_points(self, sel: Coordinates, out: Any) -> Any:
        if self._native.variable_kind:
            result = _variable_points(self._native, self._dtype, sel)
            return result if out is None else _into(out, result)
        if out is None:
            return self._view(self._native.read_points(sel.coords), sel.shape)
        arr = self._out_bytes(out, sel.shape)
        self._native.read_points(sel.coords, arr.reshape(-1).view(np.uint8))
        self._after_out(arr)
        return arr

    def get_basic_selection(
        self, selection: Any = Ellipsis, *, out: Any = None, fields: Any = None
    ) -> Any:
        """Reads integers, slices (positive steps, clamped like numpy) and one ``...``.

        A selection of one element returns a numpy scalar. ``out``: a C-contiguous numpy
        array of the result's shape and dtype to read into (returned)."""
        _no_fields(fields)
        sel = _indexing.basic(selection, self._shape)
        result = self._read(sel, out)
        return _scalar(result) if sel.shape == () else result

    def get_orthogonal_selection(
        self, selection: Any, *, out: Any = None, fields: Any = None
    ) -> Any:
        """Reads per dimension an integer, a slice, an integer array or a Boolean mask, and
        combines them like ``numpy.ix_``."""
        _no_fields(fields)
        return self._read(_indexing.orthogonal(selection, self._shape), out)

    def get_coordinate_selection(
        self, selection: Any, *, out: Any = None, fields: Any = None
    ) -> Any:
        """Reads the elements at the given coordinates: one integer array per dimension,
        broadcast together; the result has their broadcast shape."""
        _no_fields(fields)
        return self._read_points(_indexing.coordinate(selection, self._shape), out)

    def get_mask_selection(self, mask: Any, *, out: Any = None, fields: Any = None) -> Any:
        """Reads the elements where ``mask`` (a Boolean array of the array's shape) is true, in
        C order."""
        _no_fields(fields)
        return self._read_points(_indexing.mask(mask, self._shape), out)

    def get_block_selection(self, selection: Any, *, out: Any = None, fields: Any = None) -> Any:
        """Reads whole chunks by chunk index (integers or unit-step slices of chunk indices).
        Like zarr-python, a sharded array's blocks are its shards."""
        _no_fields(fields)
        basic = _block_selection(selection, self._shape, self.shards or self.chunks)
        return self._read(_indexing.basic(basic, self._shape), out)

    @property
    def oindex(self) -> _Indexer:
        """``arr.oindex[sel]``: :meth:`get_orthogonal_selection`."""
        return _Indexer(lambda s: self.get_orthogonal_selection(_oindex_sel(s)))

    @property
    def vindex(self) -> _Indexer:
        """``arr.vindex[sel]``: :meth:`get_coordinate_selection` or :meth:`get_mask_selection`."""
        return _Indexer(self._vindex)

    @property
    def blocks(self) -> _Indexer:
        """``arr.blocks[sel]``: :meth:`get_block_selection`."""
        return _Indexer(self.get_block_selection)

    def _vindex(self, selection: Any) -> Any:
        return self._read_points(_indexing.vindex(selection, self._shape), None)

    def read_crops(self, origins: Any, shape: Any, *, out: Any = None) -> npt.NDArray[Any]:
        """Reads N crops of one ``shape`` at ``origins`` (an ``(N, ndim)`` integer array) into
        one ``(N, *shape)`` array, planned and fetched as one batch: every chunk the batch
        needs is read and decoded once, however many crops share it.

        ``out``: a C-contiguous ``(N, *shape)`` array of the array's dtype to read into."""
        o, s = _crop_args(origins, shape, self.ndim)
        full = (o.shape[0], *s)
        if out is None:
            return self._view(self._native.read_crops(o, s), full)  # type: ignore[no-any-return]
        arr = self._out_bytes(out, full)
        self._native.read_crops(o, s, arr.reshape(-1).view(np.uint8))
        self._after_out(arr)
        return arr


def read_crops_many(reads: Sequence[tuple[Array, Any, Any]]) -> list[npt.NDArray[Any]]:
    """Reads crops of several arrays as one batch: ``reads`` holds ``(array, origins, shape)``
    per array, as :meth:`Array.read_crops` takes them. The chunk reads of arrays in one store
    go out in one submission (from an object store, one set of round trips for all); each
    chunk is read and decoded once. Returns one ``(N, *shape)`` array per read."""
    args = [_crop_args(o, s, a.ndim) for a, o, s in reads]
    results = _zcrop.read_crops_many(
        [a.native for a, _, _ in reads], [o for o, _ in args], [s for _, s in args]
    )
    return [
        a._view(r, (o.shape[0], *s))
        for (a, _, _), (o, s), r in zip(reads, args, results, strict=True)
    ]


def _no_fields(fields: Any) -> None:
    if fields:
        raise IndexError("invalid 'fields' argument, array does not have any fields")


def _oindex_sel(selection: Any) -> Any:
    return _indexing.replace_lists(_indexing.ensure_tuple(_indexing.pop_fields(selection)))


def _crop_args(origins: Any, shape: Any, ndim: int) -> tuple[npt.NDArray[np.uint64], list[int]]:
    s = [int(n) for n in shape] if ndim else []
    if ndim and len(s) != ndim:
        raise ValueError(f"the crop shape has {len(s)} dimensions, the array has {ndim}")
    if any(n < 0 for n in s):
        raise ValueError(f"the crop shape {tuple(s)} has a negative extent")
    return _indexing.crop_origins(origins, ndim), s


# --- async --------------------------------------------------------------------------------------


def _resolve(fut: asyncio.Future[Any], exc: BaseException | None, value: Any) -> None:
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(value)


async def await_native(submit: Callable[..., Pending], *args: Any) -> Any:
    """Runs a native ``submit_*`` call and awaits its result without blocking the loop.

    The native side calls ``notify`` from its own thread when done; ``notify`` hands the result
    to this loop with ``call_soon_threadsafe``. Cancelling the awaiting task cancels the read.
    """
    loop = asyncio.get_running_loop()
    fut: asyncio.Future[Any] = loop.create_future()

    def notify(exc: BaseException | None, value: Any) -> None:
        try:
            loop.call_soon_threadsafe(_resolve, fut, exc, value)
        except RuntimeError:  # the loop was closed meanwhile: nobody is waiting
            pass

    pending = submit(*args, notify)
    try:
        return await fut
    except asyncio.CancelledError:
        pending.cancel()
        raise


class _AsyncIndexer:
    """``arr.oindex`` / ``arr.vindex`` of an :class:`AsyncArray`: ``await x.getitem(sel)``."""

    __slots__ = ("_get",)

    def __init__(self, get: Callable[[Any], Any]) -> None:
        self._get = get

    async def getitem(self, selection: Any) -> Any:
        """Reads the selection."""
        return await self._get(selection)


class AsyncArray(_ArrayBase):
    """A Zarr array opened for reading from asyncio (``await zcrop.open_async(path)``).

    Its read methods are coroutines; many may be in flight at once. Reads run on zcrop's
    background threads and never block the event loop; they are the same Rust reads as
    :class:`Array`'s. Cancelling an awaiting task cancels its read.
    """

    __slots__ = ()

    async def _read(self, sel: Orthogonal) -> Any:
        if self._native.variable_kind:
            return await asyncio.to_thread(_variable_orthogonal, self._native, self._dtype, sel)
        result = await await_native(self._native.submit_read, [sel.dims])
        return self._view(result, sel.shape)

    async def _read_points(self, sel: Coordinates) -> Any:
        if self._native.variable_kind:
            return await asyncio.to_thread(_variable_points, self._native, self._dtype, sel)
        result = await await_native(self._native.submit_points, sel.coords)
        return self._view(result, sel.shape)

    async def getitem(self, selection: Any) -> Any:
        """``arr[selection]`` of :class:`Array`, awaited."""
        pure = _indexing.pop_fields(selection)
        if _indexing.is_pure_fancy_indexing(pure, self.ndim):
            return await self._read_points(_indexing.vindex(pure, self._shape))
        if _indexing.is_pure_orthogonal_indexing(pure, self.ndim):
            return await self.get_orthogonal_selection(pure)
        return await self.get_basic_selection(pure)

    async def get_basic_selection(self, selection: Any = Ellipsis, *, fields: Any = None) -> Any:
        """:meth:`Array.get_basic_selection`, awaited."""
        _no_fields(fields)
        sel = _indexing.basic(selection, self._shape)
        result = await self._read(sel)
        return _scalar(result) if sel.shape == () else result

    async def get_orthogonal_selection(self, selection: Any, *, fields: Any = None) -> Any:
        """:meth:`Array.get_orthogonal_selection`, awaited."""
        _no_fields(fields)
        return await self._read(_indexing.orthogonal(selection, self._shape))

    async def get_coordinate_selection(self, selection: Any, *, fields: Any = None) -> Any:
        """:meth:`Array.get_coordinate_selection`, awaited."""
        _no_fields(fields)
        return await self._read_points(_indexing.coordinate(selection, self._shape))

    async def get_mask_selection(self, mask: Any, *, fields: Any = None) -> Any:
        """:meth:`Array.get_mask_selection`, awaited."""
        _no_fields(fields)
        return await self._read_points(_indexing.mask(mask, self._shape))

    @property
    def oindex(self) -> _AsyncIndexer:
        """``await arr.oindex.getitem(sel)``: :meth:`get_orthogonal_selection`."""
        return _AsyncIndexer(lambda s: self.get_orthogonal_selection(_oindex_sel(s)))

    @property
    def vindex(self) -> _AsyncIndexer:
        """``await arr.vindex.getitem(sel)``: a coordinate or mask selection."""
        return _AsyncIndexer(lambda s: self._read_points(_indexing.vindex(s, self._shape)))

    async def read_crops(self, origins: Any, shape: Any) -> npt.NDArray[Any]:
        """:meth:`Array.read_crops`, awaited."""
        o, s = _crop_args(origins, shape, self.ndim)
        full = (o.shape[0], *s)
        result = await await_native(self._native.submit_crops, o, s)
        return self._view(result, full)  # type: ignore[no-any-return]
