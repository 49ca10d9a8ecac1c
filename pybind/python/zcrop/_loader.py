"""``zcrop.Loader``: deterministic batches of random crops, read ahead in the background.

A thin shell over the Rust sampler and loader: batch ``step`` of rank ``rank`` is a pure
function of ``(seed, step, rank, world_size)`` and the spec, so ``state_dict()`` is just the
next step and ``load_state_dict()`` resumes exactly there.

**Buffers and their lifetime.** Batches are read into a ring of reusable (page-locked where the
OS allows) host buffers. With ``copy=False`` (the default) each array of a batch is a read-only
numpy view of its ring buffer, made without a copy; the buffer goes back to the loader only
when every array (and every view, tensor or jax array made from it without a copy) of that
batch is gone. So keeping at most ``buffers - prefetch`` batches alive at a time keeps the
pipeline running; holding more makes :meth:`Loader.__next__` raise :class:`zcrop.LoaderError`
(``buffers`` defaults to ``prefetch + 1``, i.e. one batch held while the next ones are read).
``copy=True`` returns ordinary writable arrays instead and hands the buffer back at once.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, TypeVar, Union, cast

import numpy as np

from zcrop._align import (
    Alignment,
    alignment_conflict,
    lookup_dims,
    position_labels,
    resolved_dims,
    source_windows,
)
from zcrop._api import is_url, storage_option_pairs
from zcrop._array import Array
from zcrop._fields import ValidMask, _fields, check_grid
from zcrop.errors import InvalidArgumentError
from zcrop._zcrop import NativeArray, NativeBatch, NativeLoader, NativeSampler

__all__ = ["Batch", "Dim", "Loader", "Source"]

#: A batch: one array per source (by name), and ``"meta"``, one dict per sample.
Batch = dict[str, Any]


class Dim:
    """How one array dimension's crop origin follows the sample position.

    ``Dim.along("y")`` follows position dimension ``y`` one to one; ``.scale(1, 4)`` for an
    array 4x coarser than the position grid, ``.offset(2)`` shifts it, ``.jitter(1)`` adds a
    per-sample uniform jitter in ``[-1, 1]``. ``Dim.fixed(0)`` always starts at 0 (e.g. all
    channels). In a :class:`Source`'s ``dims``, a string means ``Dim.along(name)`` and an int
    ``Dim.fixed(origin)``. ``.wrap()`` makes the array periodic along the dimension
    (longitude): crops across its end continue at its start.
    """

    __slots__ = ("_spec", "_wrap")

    def __init__(self, spec: tuple[Any, ...], wrap: bool = False) -> None:
        self._spec = spec
        self._wrap = wrap

    @staticmethod
    def along(position: str) -> Dim:
        """Follows position dimension ``position`` one to one."""
        return Dim(("along", str(position), 1, 1, 0, 0))

    @staticmethod
    def fixed(origin: int) -> Dim:
        """Always starts at ``origin``."""
        return Dim(("fixed", int(origin)))

    def _aligned(self, what: str) -> tuple[Any, ...]:
        if self._spec[0] != "along":
            raise ValueError(f"{what} applies to Dim.along(...), not to a fixed dimension")
        return self._spec

    def scale(self, num: int, den: int = 1) -> Dim:
        """Scales the position by ``num / den`` (rounded down)."""
        s = self._aligned("scale")
        return Dim((s[0], s[1], int(num), int(den), s[4], s[5]), self._wrap)

    def offset(self, offset: int) -> Dim:
        """Adds ``offset`` array elements to the origin."""
        s = self._aligned("offset")
        return Dim((s[0], s[1], s[2], s[3], int(offset), s[5]), self._wrap)

    def jitter(self, jitter: int) -> Dim:
        """Jitters the origin by a uniform integer in ``[-jitter, jitter]`` per sample."""
        s = self._aligned("jitter")
        return Dim((s[0], s[1], s[2], s[3], s[4], int(jitter)), self._wrap)

    def wrap(self) -> Dim:
        """The array is periodic along this dimension: origins wrap around its end."""
        return Dim(self._aligned("wrap"), True)

    def __repr__(self) -> str:
        if self._spec[0] == "fixed":
            return f"Dim.fixed({self._spec[1]})"
        _, name, num, den, offset, jitter = self._spec
        wrap = ".wrap()" if self._wrap else ""
        return f"Dim.along({name!r}).scale({num}, {den}).offset({offset}).jitter({jitter}){wrap}"


def _dim(d: Any) -> tuple[Any, ...]:
    if isinstance(d, Dim):
        return d._spec
    if isinstance(d, str):
        return Dim.along(d)._spec
    if isinstance(d, (int, np.integer)) and not isinstance(d, bool):
        return Dim.fixed(int(d))._spec
    raise TypeError(f"a dim is a Dim, a position name or a fixed origin, got {d!r}")


_DTYPES = {
    None: "native",
    "float32": "float32",
    "float64": "float64",
    "float16": "float16",
    "bfloat16": "bfloat16",
}


def _np_dtype(name: str) -> np.dtype[Any]:
    """The numpy dtype of a delivered element type: numpy's own, or ml_dtypes' bfloat16
    (numpy has none; jax depends on ml_dtypes, and torch views it as ``torch.bfloat16``)."""
    if name != "bfloat16":
        return np.dtype(name)
    try:
        import ml_dtypes
    except ImportError:
        raise ImportError(
            "dtype='bfloat16' delivers numpy arrays of ml_dtypes.bfloat16: "
            "pip install ml-dtypes"
        ) from None
    bf16: np.dtype[Any] = np.dtype(ml_dtypes.bfloat16)
    return bf16


class Source:
    """One dataset of each sample: an array, the crop shape, how crop origins follow the
    sample position, and what happens to the crops on their way into the batch.

    Parameters
    ----------
    array:
        A path or URL (``s3://bucket/data.zarr/t2m``) of a Zarr array, a :class:`zcrop.Array`,
        or a variable of a Dataset opened with ``xr.open_dataset(..., engine="zcrop")``
        (``ds["t2m"]``, as opened: not indexed or loaded).
    crop:
        The crop shape: one entry per array dimension, or a mapping ``{dimension name: size}``
        (dimensions left out are taken whole).
    name:
        The source's name in each batch (default: the variable's name, the array's basename,
        or ``"data"``).
    dims:
        Per array dimension, a :class:`Dim`, a position name (follows it) or an int (fixed
        origin). By default dimensions named like positions follow them and the others start
        at 0; an array without dimension names follows the positions in order.
    dtype:
        ``None`` (the array's own dtype), ``"float32"``, ``"float64"``, ``"float16"`` or
        ``"bfloat16"`` (rounded to nearest; numpy arrays of ``ml_dtypes.bfloat16``, torch
        tensors of ``torch.bfloat16``; no ``fft`` with either 16-bit type).
    decode:
        For an xarray variable: CF-decode the values as xarray does (``_FillValue`` and
        ``missing_value`` become NaN, then ``x * scale_factor + add_offset``), fused into the
        read before ``normalize``; the default where the variable has such encodings (then
        ``dtype`` defaults to float32). ``decode=False`` delivers the stored values. Meta
        labels of an xarray source come from its decoded coordinates (datetime64 for times).
    normalize:
        ``(axis, mean, std)``: ``(x - mean[c]) / std[c]`` per index ``c`` along crop axis
        ``axis``, fused into the read.
    fft:
        ``{"axes": [...], "output": "complex" | "power", "norm": "backward" | "ortho" |
        "forward"}``: numpy's ``fftn`` of each (converted, normalised) crop over ``axes``.
        Needs ``dtype`` float32 (complex64 output) or float64 (complex128).
    coords:
        Label samples with the values of 1-d coordinate arrays named like the dimensions
        (sibling arrays), when there are any.
    align:
        For an xarray source: how its crop origin along each position dimension follows the
        position's label, by its own coordinate: ``"exact"`` (the default; the same label),
        ``"nearest"`` (ties to the larger label, as ``sel(method="nearest")``),
        ``"previous"`` (the latest label at or before it: forecasts by init time,
        observations that arrive late) or ``"next"``. One rule, or ``{dimension: rule}``.
        Positions where the source has no alignment are never drawn.
    tolerance:
        The largest distance between a position's label and the label ``align`` picks
        (label units: a timedelta or a string like ``"30min"`` for times, a number
        otherwise); one value or ``{dimension: value}``. ``None``: no limit.
    window:
        ``{dimension: (start, stop)}``, the crop along a dimension relative to the aligned
        index: ints are the source's own steps (``(-3, 1)``: 3 steps before to the aligned
        one, half-open), label units are inclusive (``("-1h", "0h")``: from one hour before
        the position's time to it; the crop size follows from the coordinate's spacing,
        which must be regular). A window sets the crop along its dimension.
    every:
        ``{dimension name: k}`` (or one int per dimension): take every ``k``-th element
        inside the crop, e.g. hourly frames from 15-minute data with ``{"time": 4}``. The
        crop size counts the elements taken; the window spans ``(n - 1) * k + 1``.
    select:
        ``{dimension name: labels}``: take these elements of a dimension that follows no
        position, in this order, e.g. ``{"channel": ["IR_108", "VIS_006"]}`` (labels of an
        xarray source's coordinate, or integer indices). Sets the crop along it.
    wrap:
        The name of a dimension along which the array is periodic (longitude on a global
        grid): positions take every index along it, and a crop across the array's end
        continues at index 0 (e.g. 350..10 degrees). Its labels align modulo the period
        (-180..180 positions against a 0..360 grid). One per source.
    pad:
        A dimension name (or a list of them; axis numbers for an array without names) along
        which crops may pass the array's ends, e.g. windows centred on every pixel of a
        regional grid, or latitude windows at the poles of a global one. Positions then take
        every index along it (or every label an aligned source matches), and elements
        outside the array are ``fill``. Meta origins are signed there, and labels past an
        end continue the coordinate's spacing. Not with ``fft``, or with ``normalize`` along
        a padded dimension.
    fill:
        The value of padded elements, in the delivered dtype (after ``decode`` and
        ``normalize``): by default NaN where that dtype is a float type, and the array's
        fill value for integers.
    storage_options:
        For a URL: the object store's options (``endpoint_url``, ``region``, ``anon``, ``key``,
        ``secret``, ...), as for :func:`zcrop.open`.
    """

    __slots__ = (
        "_align",
        "_axis_names",
        "_dim_names",
        "_every",
        "_labels",
        "_pad",
        "_picks",
        "_spec",
        "_wrap",
        "name",
    )

    def __init__(
        self,
        array: Any,
        crop: Sequence[int] | Mapping[str, int],
        *,
        name: str | None = None,
        dims: Sequence[Any] | None = None,
        dtype: Any = None,
        normalize: tuple[int, Sequence[float], Sequence[float]] | None = None,
        fft: Mapping[str, Any] | None = None,
        coords: bool = True,
        storage_options: Mapping[str, Any] | None = None,
        decode: bool | None = None,
        align: str | Mapping[str, str] | None = None,
        tolerance: Any = None,
        window: Mapping[str, tuple[Any, Any]] | None = None,
        every: Sequence[int] | Mapping[str, int] | None = None,
        select: Mapping[str, Sequence[Any]] | None = None,
        wrap: str | None = None,
        pad: str | int | Sequence[str | int] | None = None,
        fill: float | None = None,
    ) -> None:
        options = storage_option_pairs(storage_options)
        #: Per dimension name, the decoded coordinate labels (xarray sources).
        self._labels: dict[str, np.ndarray[Any, Any]] = {}
        #: The dimension names the source was given with (xarray sources).
        self._dim_names: list[str] | None = None
        #: Per labelled dimension, how it aligns with its position's labels (xarray sources).
        self._align: dict[str, Alignment] = {}
        decoding = None
        if _is_xarray_variable(array):
            array, self._dim_names, decoding, self._labels, default_var = _from_xarray(
                array, decode
            )
            if name is None:
                name = default_var
            if decoding is not None and dtype is None:
                dtype = "float32"
        elif decode:
            raise ValueError("decode= applies to variables of an xarray Dataset")
        else:
            for what, value in (("align", align), ("tolerance", tolerance), ("window", window)):
                if value is not None:
                    raise ValueError(
                        f"{what}= aligns by coordinate labels: it applies to variables of an "
                        "xarray Dataset opened with engine='zcrop'"
                    )
        names = self._dim_names
        named_pad = pad is not None and any(
            not isinstance(a, (int, np.integer))
            for a in ([pad] if isinstance(pad, (str, int, np.integer)) else pad)
        )
        if isinstance(crop, Mapping) or isinstance(every, Mapping) or select or wrap or named_pad:
            names = _dimension_names(array, names)
        if isinstance(crop, Mapping):
            assert names is not None
            crop = _crop_by_name(crop, array, names)
        crop = [int(c) for c in crop]
        #: Per picked axis, the indices its crops take (``select=``).
        self._picks: dict[int, list[int]] = {}
        if select:
            assert names is not None
            self._picks = _selected(select, names, self._labels, crop, name, (window, every))
        steps = _per_axis(every, names, len(crop), "every")
        if self._dim_names is not None:
            by_name = dict(zip(self._dim_names, crop))
            self._align = source_windows(
                str(name),
                self._dim_names,
                self._labels,
                by_name,
                align,
                tolerance,
                window,
                dict(zip(self._dim_names, steps)),
            )
            crop = [by_name[d] for d in self._dim_names]
        if isinstance(array, Array):
            # By directory or URL, so a Source pickles (for DataLoader workers started by
            # spawn); an array in an object store keeps the options it was opened with.
            native: NativeArray | str = array.native.uri
            if options is None and array.native.storage_options:
                options = list(array.native.storage_options)
            default_name = array.basename or "data"
        elif isinstance(array, (str, os.PathLike)):
            native = os.fspath(array)
            if options and not is_url(native):
                raise ValueError(
                    f"storage_options apply to object-store URLs; {native!r} is a local path"
                )
            default_name = os.path.basename(os.path.normpath(native.rstrip("/"))) or "data"
        else:
            raise TypeError(f"a source's array is a path or a zcrop.Array, got {type(array)!r}")
        key = None if dtype is None else str(getattr(dtype, "name", dtype))
        if key not in _DTYPES and dtype is not None:
            try:
                key = np.dtype(dtype).name
            except TypeError:
                pass
        if key not in _DTYPES:
            raise ValueError(
                f"dtype must be None, float32, float64, float16 or bfloat16, got {dtype!r}"
            )
        if key == "bfloat16":
            _np_dtype(key)  # ml_dtypes is needed to deliver it: say so now
        self.name: str = str(name) if name is not None else default_name
        norm_spec = None
        if normalize is not None:
            axis, mean, std = normalize
            norm_spec = (int(axis), [float(m) for m in mean], [float(s) for s in std])
        fft_spec = None
        if fft is not None:
            fft_spec = (
                [int(a) for a in fft["axes"]],
                str(fft.get("output", "complex")),
                str(fft.get("norm", "backward")),
            )
        #: Per dimension, the step between the elements a crop takes.
        self._every = steps
        dim_specs = None
        if dims is not None:
            dim_specs = [
                ("pick", self._picks[a]) if a in self._picks else (*_dim(d), k)
                for a, (d, k) in enumerate(zip(dims, steps))
            ]
            if len(dim_specs) != len(crop):
                raise ValueError(
                    f"source {self.name!r}: {len(list(dims))} dims for a crop of {len(crop)}"
                )
        elif any(k != 1 for k in steps) and names is None:
            raise ValueError(
                f"source {self.name!r}: every= needs the dimensions' roles: give dims= (or "
                "an array with dimension names)"
            )
        #: The dimension names, where known (they place dimensions when dims= is not given).
        self._axis_names = names
        #: The periodic axis, if any.
        self._wrap: int | None = None
        if wrap is not None:
            assert names is not None
            if wrap not in names:
                raise ValueError(f"wrap names {wrap!r}, not a dimension of the array ({names})")
            self._wrap = names.index(wrap)
        for axis, d in enumerate(dims or []):
            if isinstance(d, Dim) and d._wrap:
                if self._wrap not in (None, axis):
                    raise ValueError("one periodic dimension per source")
                self._wrap = axis
        #: The padded axes.
        self._pad: list[int] = _padded(pad, names, len(crop), self.name)
        if fill is not None and not self._pad:
            raise ValueError(f"source {self.name!r}: fill= is the value of padding; give pad=")
        self._spec: dict[str, Any] = {
            "name": self.name,
            "array": native,
            "crop": crop,
            "dims": dim_specs,
            "dtype": _DTYPES[key],
            "normalize": norm_spec,
            "fft": fft_spec,
            "decode": decoding,
            "coords": bool(coords),
            "storage_options": options,
            "pad": self._pad,
            "fill": None if fill is None else float(fill),
        }

    def __repr__(self) -> str:
        return f"Source({self.name!r}, crop={tuple(self._spec['crop'])})"


def _is_xarray_variable(obj: Any) -> bool:
    return type(obj).__module__.startswith("xarray.") and hasattr(obj, "variable")


def _from_xarray(
    da: Any, decode: bool | None
) -> tuple[Array, list[str], tuple[float, float, list[float]] | None, dict[str, Any], str]:
    """A variable of a Dataset opened with engine="zcrop": its zcrop array, dimension names,
    CF decoding ``(scale_factor, add_offset, fills)`` (``None`` for none), decoded 1-d
    coordinate labels per dimension, and name."""
    from zcrop._xarray import _source

    name = str(da.name) if da.name is not None else "data"
    backend, _ = _source(da.variable, name)
    if backend is None:
        raise TypeError(
            f"variable {name!r} is loaded in memory: a Source reads it from its store, so pass "
            "the variable of a Dataset opened with engine='zcrop' before .load()/.values"
        )
    array = backend._array
    dims = [str(d) for d in da.dims]
    enc = da.encoding
    stored = np.dtype(enc.get("dtype", array.dtype))
    packed = "scale_factor" in enc or "add_offset" in enc
    fills = []
    for key in ("_FillValue", "missing_value"):
        for v in np.atleast_1d(enc.get(key, [])):
            f = float(np.asarray(v).astype(stored).astype("f8"))
            if not np.isnan(f) and f not in fills:
                fills.append(f)
    if np.issubdtype(stored, np.datetime64) or "units" in enc and "since" in str(enc["units"]):
        wants = "times"
    else:
        wants = None
    if decode is None:
        decode = packed or bool(fills)
    decoding = None
    if decode:
        if wants:
            raise ValueError(
                f"variable {name!r} holds {wants} (CF units {enc.get('units')!r}); a Source "
                "decodes scale, offset and fill values only: pass decode=False for the stored "
                "values"
            )
        decoding = (
            float(enc.get("scale_factor", 1.0)),
            float(enc.get("add_offset", 0.0)),
            fills,
        )
    labels = {
        d: np.asarray(da.coords[d].values)
        for d in dims
        if d in da.coords and da.coords[d].dims == (d,)
    }
    return array, dims, decoding, labels, name


def _open_array(array: Any) -> Array:
    if isinstance(array, Array):
        return array
    from zcrop._api import open_array

    return open_array(os.fspath(array))


def _dimension_names(array: Any, names: list[str] | None) -> list[str]:
    """The array's dimension names: given, v3 ``dimension_names``, or xarray's v2 attribute
    (as the sampler reads them)."""
    if names is not None:
        return names
    arr = _open_array(array)
    given = arr.dimension_names or arr.attrs.get("_ARRAY_DIMENSIONS") or []
    if len(given) != arr.ndim:
        raise ValueError(
            f"a crop or every= by dimension name needs the array's dimension names; "
            f"{arr.name} has none"
        )
    return [str(n) if n else f"dim_{i}" for i, n in enumerate(given)]


def _crop_by_name(crop: Mapping[str, int], array: Any, names: list[str]) -> list[int]:
    """A crop given as ``{dimension name: size}`` as one size per dimension."""
    arr = _open_array(array)
    unknown = [k for k in crop if k not in names]
    if unknown:
        raise ValueError(f"crop names {unknown}, not dimensions of the array ({names})")
    return [int(crop.get(d, n)) for d, n in zip(names, arr.shape)]


def _selected(
    select: Mapping[str, Sequence[Any]],
    names: list[str],
    labels: Mapping[str, np.ndarray[Any, Any]],
    crop: list[int],
    name: str | None,
    others: tuple[Any, Any],
) -> dict[int, list[int]]:
    """``select=`` as the indices each picked axis takes (setting ``crop`` along it)."""
    out: dict[int, list[int]] = {}
    for d, wanted in select.items():
        what = f"source {name!r} select[{d!r}]"
        if d not in names:
            raise ValueError(f"{what}: not a dimension of the array ({names})")
        if any(isinstance(o, Mapping) and d in o for o in others):
            raise ValueError(f"{what}: a selected dimension takes no window or every")
        items = np.atleast_1d(np.asarray(wanted)).tolist()
        if not items:
            raise ValueError(f"{what} is empty")
        coord = labels.get(d)
        if coord is not None and not all(isinstance(x, (int, np.integer)) for x in items):
            found = {v: i for i, v in reversed(list(enumerate(coord.tolist())))}
            missing = [x for x in items if x not in found]
            if missing:
                raise ValueError(
                    f"{what}: {missing} not among its labels {coord.tolist()[:20]}"
                )
            idx = [found[x] for x in items]
        else:
            idx = [int(x) for x in items]
        axis = names.index(d)
        out[axis] = idx
        crop[axis] = len(idx)
    return out


def _padded(
    pad: str | int | Sequence[str | int] | None, names: list[str] | None, ndim: int, name: str
) -> list[int]:
    """The axes ``pad=`` names (dimension names or axis numbers), sorted."""
    if pad is None:
        return []
    given = [pad] if isinstance(pad, (str, int, np.integer)) else list(pad)
    axes = set()
    for a in given:
        if isinstance(a, (int, np.integer)):
            if not 0 <= int(a) < ndim:
                raise ValueError(f"source {name!r}: pad axis {a} is not one of {ndim} dimensions")
            axes.add(int(a))
        else:
            assert names is not None
            if a not in names:
                raise ValueError(
                    f"source {name!r}: pad names {a!r}, not a dimension of the array ({names})"
                )
            axes.add(names.index(a))
    return sorted(axes)


def _per_axis(
    value: Sequence[int] | Mapping[str, int] | None, names: list[str] | None, ndim: int, what: str
) -> list[int]:
    """A per-dimension setting given by name or in order, as one int per dimension."""
    if value is None:
        return [1] * ndim
    if isinstance(value, Mapping):
        assert names is not None
        unknown = [k for k in value if k not in names]
        if unknown:
            raise ValueError(f"{what} names {unknown}, not dimensions of the array ({names})")
        out = [int(value.get(d, 1)) for d in names]
    else:
        out = [int(k) for k in value]
        if len(out) != ndim:
            raise ValueError(f"{what} has {len(out)} entries for {ndim} dimensions")
    if any(k < 1 for k in out):
        raise ValueError(f"{what} must be at least 1 per dimension, got {out}")
    return out


def _sources(sources: Any) -> list[Source]:
    if isinstance(sources, Source):
        out = [sources]
    elif isinstance(sources, Mapping):
        out = []
        for name, s in sources.items():
            if not isinstance(s, Source):
                raise TypeError(f"source {name!r} is not a zcrop.Source")
            s.name = s._spec["name"] = str(name)
            out.append(s)
    else:
        out = list(sources)
        if not all(isinstance(s, Source) for s in out):
            raise TypeError("sources must be zcrop.Source objects")
    if not out:
        raise ValueError("a loader needs at least one source")
    names = [s.name for s in out]
    if len(set(names)) != len(names):
        raise ValueError(f"source names must be unique, got {names}")
    if "meta" in names:
        raise ValueError("'meta' is reserved for the per-sample metadata of each batch")
    return out


def _positions(first: Source) -> list[str]:
    if first._dim_names is not None:
        return list(first._dim_names)
    arr = first._spec["array"]
    native = (
        arr
        if isinstance(arr, NativeArray)
        else Array(_open_native(arr, first._spec["storage_options"])).native
    )
    names = native.dimension_names
    ndim = len(native.shape)
    if names and all(names):
        return [str(n) for n in names]
    return [f"dim_{i}" for i in range(ndim)]


def _open_native(path: str, options: list[tuple[str, str]] | None = None) -> NativeArray:
    from zcrop import _zcrop

    node = _zcrop.open_node(path, options)
    if not isinstance(node, NativeArray):
        raise TypeError(f"{path} is a group, not an array")
    return node


def _space_spec(
    srcs: list[Source],
    positions: Sequence[str] | Mapping[str, Any] | None,
    seed: int,
    mode: str,
    stride: Sequence[int] | None,
    region: tuple[Sequence[int], Sequence[int]] | None,
    valid: Any = None,
    valid_times: Any = None,
    weights: Any = None,
) -> dict[str, Any]:
    """The sample space of a loader spec: the sources, the position dimensions, the masks and
    weights over them, and how positions are drawn. Two entries are for the caller, not the
    sampler: ``labelled`` (see :func:`check_grid`) and ``why_empty`` (see :func:`built`)."""
    if mode not in ("uniform", "epoch"):
        raise ValueError(f"mode must be 'uniform' or 'epoch', got {mode!r}")
    if mode == "epoch" and stride is None:
        raise ValueError("epoch mode needs a stride per position dimension")
    given = positions if isinstance(positions, Mapping) else None
    if isinstance(positions, str):
        raise TypeError("positions is a list of dimension names or a mapping, not a string")
    names = [str(n) for n in positions] if positions is not None else _positions(srcs[0])
    _check_position_names(srcs, names, region is not None)
    resolved = resolved_dims(srcs, names)
    labels, ranges = position_labels(srcs, resolved, names, given)
    explicit = {
        str(d) for d, v in (given or {}).items() if v is not None and not isinstance(v, slice)
    }
    dims = _wrapped(srcs, lookup_dims(srcs, resolved, names, labels, explicit))
    masks, weight_field, labelled = _fields(srcs, names, valid, valid_times, weights, labels)
    for d in explicit:
        labelled[d] = len(labels[d])
    if region is not None:
        region = ([int(x) for x in region[0]], [int(x) for x in region[1]])
    if ranges:
        start, end = region or ([0] * len(names), [2**64 - 1] * len(names))
        for i, d in enumerate(names):
            if d in ranges:
                start[i] = max(start[i], ranges[d][0])
                end[i] = min(end[i], ranges[d][1])
        region = (start, end)
    return {
        "positions": names,
        "sources": [
            s._spec if d is None else {**s._spec, "dims": d} for s, d in zip(srcs, dims)
        ],
        "mode": mode,
        "stride": None if stride is None else [int(x) for x in stride],
        "region": region,
        "seed": int(seed),
        "masks": masks,
        "weights": weight_field,
        "labelled": labelled,
        "why_empty": lambda: alignment_conflict(srcs, dims, labels),
    }


_Native = TypeVar("_Native")


def built(
    make: Callable[[dict[str, Any]], _Native],
    spec: dict[str, Any],
    why_empty: Callable[[], str | None],
) -> _Native:
    """``make(spec)`` (a native sampler or loader). Where it finds no sample position and the
    sources' alignments are why (``why_empty``), the error names the sources and dimension
    instead of the sampler's "the masks allow no lattice point"."""
    try:
        return make(spec)
    except InvalidArgumentError as e:
        if "no valid sample position" not in str(e):
            raise
        why = why_empty()
        if why is None:
            raise
        raise InvalidArgumentError(why) from e


def _wrapped(
    srcs: list[Source], dims: list[list[tuple[Any, ...]] | None]
) -> list[list[tuple[Any, ...]] | None]:
    """The dims of each source with its periodic axis marked (the flag after ``every``)."""
    out = []
    for src, spec in zip(srcs, dims):
        if src._wrap is not None and spec is not None:
            spec = list(spec)
            d = spec[src._wrap]
            width = {"along": 7, "lookup": 6}.get(d[0])
            if width is None:
                raise ValueError(
                    f"source {src.name!r}: its periodic dimension {src._wrap} follows no position"
                )
            spec[src._wrap] = (*d, *([1] * (width - len(d))), True)
        out.append(spec)
    return out


def _check_position_names(srcs: list[Source], names: list[str], region: bool) -> None:
    """A position that no source's dimension names (a typo) is an error listing the names
    there are, unless a region bounds it or a source's dimensions are unnamed."""
    import difflib

    known: set[str] = set()
    for src in srcs:
        dims = src._spec["dims"]
        if dims is not None:
            followed = [str(d[1]) for d in dims if d[0] == "along"]
            for name in followed:
                if name not in names:
                    hint = difflib.get_close_matches(name, names, n=1)
                    raise ValueError(
                        f"source {src.name!r} follows {name!r} in dims=, which is not a "
                        f"position ({names})" + (f"; did you mean {hint[0]!r}?" if hint else "")
                    )
            known |= set(followed)
        elif src._axis_names is not None:
            known |= set(src._axis_names)
        else:
            return
    unknown = [n for n in names if n not in known]
    if unknown and not region:
        hint = difflib.get_close_matches(unknown[0], sorted(known), n=1)
        raise ValueError(
            f"position {unknown[0]!r} is not a dimension any source follows (their "
            f"dimensions: {sorted(known)})" + (f"; did you mean {hint[0]!r}?" if hint else "")
        )


def sampler_spec(space: dict[str, Any]) -> dict[str, Any]:
    """A spec for ``NativeSampler`` (one sample per step, no loader threads) over ``space``."""
    return {
        **space,
        "batch_size": 1,
        "start_step": 0,
        "end_step": None,
        "rank": 0,
        "world_size": 1,
        "prefetch": 1,
        "buffers": 0,
        "workers": 1,
        "threads": None,
        "pin": False,
    }


SourceLabels = dict[
    str, tuple[list[str], dict[str, Any], list[int], dict[int, list[int]], int | None]
]


def _source_labels(srcs: list[Source]) -> SourceLabels:
    """The decoded coordinate labels of each xarray source (and the steps its crops take), by
    source name."""
    return {
        src.name: (src._dim_names, src._labels, src._every, src._picks, src._wrap)
        for src in srcs
        if src._labels and src._dim_names is not None
    }


def _window_labels(
    coord: np.ndarray[Any, Any], o: int, n: int, k: int, picks: list[int] | None, wrap: bool
) -> np.ndarray[Any, Any]:
    """The labels of a window of ``n`` elements ``k`` apart from ``o`` (or of the picked
    elements), wrapping around the end of a periodic dimension; past the ends of a padded
    one, the spacing of the two nearest labels continues."""
    if picks is not None:
        index: Any = picks
    elif wrap:
        index = (o + np.arange(n) * k) % len(coord)
    elif o < 0 or o + (n - 1) * k >= len(coord):
        return _extended(np.asarray(coord), o + np.arange(n) * k)
    else:
        index = slice(o, o + (n - 1) * k + 1, k)
    return np.asarray(coord[index])


def _extended(coord: np.ndarray[Any, Any], index: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """``coord[index]`` with indices past either end labelled by the spacing of the two labels
    nearest to that end (the end label itself for a coordinate of one label)."""
    inside = np.clip(index, 0, len(coord) - 1)
    out: np.ndarray[Any, Any] = coord[inside].copy()
    if len(coord) < 2 or coord.dtype.kind not in "iufmM":
        return out
    before, after = index < 0, index >= len(coord)
    out[before] = coord[0] + (coord[0] - coord[1]) * (-index[before])
    out[after] = coord[-1] + (coord[-1] - coord[-2]) * (index[after] - len(coord) + 1)
    return out


def _labelled(samples: list[dict[str, Any]], labels: SourceLabels) -> list[dict[str, Any]]:
    """Adds each xarray source's coordinate labels to the samples' metadata."""
    for sample in samples if labels else ():
        for name, (dims, coords, every, picks, wrap) in labels.items():
            entry = sample["sources"][name]
            entry["labels"] = {
                d: _window_labels(coords[d], o, n, k, picks.get(a), a == wrap)
                for a, (d, o, n, k) in enumerate(zip(dims, entry["origin"], entry["shape"], every))
                if d in coords
            }
    return samples


#: The most batches ``prefetch="auto"`` reads ahead.
AUTO_PREFETCH_MAX = 16


class Loader:
    """Batches of random crops over one or more sources, read ahead in the background.

    Iterating yields batches: a dict with one ``(batch_size, *crop)`` array per source (by
    name) and ``"meta"``, a list with one dict per sample (``step``, ``index``,
    ``global_index``, ``epoch``, ``position`` and, per source, ``array``, ``origin``,
    ``shape`` and coordinate labels). Batch ``step`` is a pure function of the seed, the
    step, the rank and the world size.

    Parameters
    ----------
    sources:
        A :class:`Source`, a list of them, or a dict ``name -> Source``.
    positions:
        Names of the sample position dimensions (default: the first source's dimension
        names, or ``dim_0 ...``), or a mapping ``{name: labels}`` that also says where
        positions lie: ``None`` (every label of the first xarray source following it), a
        label slice (``slice("2020-01-01", "2021-12-31")``, inclusive as ``sel``) or an
        explicit list of labels (e.g. the t0 times of a split). Along a labelled dimension
        every xarray source aligns by its own coordinate (see :class:`Source`'s ``align``).
    batch_size:
        Samples per batch on this rank.
    seed:
        The seed.
    rank, world_size:
        This process's share of each global batch of ``batch_size * world_size`` samples.
    prefetch:
        Batches read ahead of the consumer: a number, or ``"auto"`` (the default), which
        starts at 2 and reads further ahead while the consumer waits for batches and more in
        flight deliver more, up to 16 batches and 1 GiB of ring buffers: enough to hide an
        object store's latency, without growing where decoding is the limit.
    mode:
        ``"uniform"`` (independent draws) or ``"epoch"`` (every lattice point of ``stride``
        once per epoch, in a new pseudo-random order each epoch).
    stride:
        The lattice spacing per position dimension in epoch mode.
    region:
        ``(start, end)`` per position dimension: sample positions only in ``[start, end)``.
        A position is where a window *starts* (the crop origin of a source that follows it
        one to one): the window that starts at ``end - 1`` ends at index ``end + crop - 2``. To
        keep whole windows inside ``[a, b)``, pass ``end = b - crop + 1``.
    valid:
        Sample only positions where this mask is true (a position is where windows start, as
        for ``region``). A boolean numpy array over the position dimensions, either one
        value per position of the position grid or one per block of ``c`` positions
        (``ceil(n / c)`` values for ``n`` grid positions); the grid has, per dimension, the
        size of the first source's array along it (see docs/python.md). Or an xarray
        DataArray over some of the position dimensions, matched to the positions' coordinate
        labels (each position takes the nearest label; dimensions it lacks are not
        restricted), at any resolution. Or a :class:`zcrop.ValidMask` from
        :func:`zcrop.valid_windows` (windows free of NaN and fill values), or a list of masks
        (all must allow a position). Stored as cells and runs: never one entry per position
        unless given so.
    valid_times:
        Allowed labels of the position dimension labelled by datetimes (e.g. the t0 times of
        a training split); every label must be one of the positions'.
    weights:
        Draw positions with probability proportional to these non-negative weights (uniform
        mode only), in the same forms as ``valid``; zero excludes a position. Draws stay a
        pure function of the seed and the global sample index.
    steps:
        Stop after this many steps (``len(loader)``); ``None`` iterates forever.
    start_step:
        The first step.
    workers:
        Threads producing batches (each batch is also decoded in parallel); the default, 2,
        keeps a second batch in flight while one does its serial start (planning, locating,
        submitting), when the decode threads would otherwise wait. On many cores more help
        (with ``prefetch`` at least as large; see docs/performance.md).
    threads:
        Decode threads of the loader's own (default: the shared pool).
    pin:
        Page-lock the ring buffers and register them with CUDA when present. A copy from them
        to the GPU with ``non_blocking=True`` then runs later, on the GPU's stream: keep the
        batch until the copy has completed (``zcrop.torch.ZcropDataset`` and
        ``zcrop.jax.JaxLoader`` do), or its ring buffer may be refilled first.
    buffers:
        Ring buffers (default ``prefetch + 1``; an adaptive ``prefetch`` adds one per batch it
        reads further ahead).
    copy:
        Return writable copies instead of read-only views of the ring buffers.
    shared_memory:
        Map the ring buffers from memory files that other processes can map too (in
        ``zcrop.torch``'s DataLoader workers, batches reach the main process this way, with no
        copy).
    """

    def __init__(
        self,
        sources: Any,
        *,
        positions: Sequence[str] | Mapping[str, Any] | None = None,
        batch_size: int = 1,
        seed: int = 0,
        rank: int = 0,
        world_size: int = 1,
        prefetch: int | str = "auto",
        mode: str = "uniform",
        stride: Sequence[int] | None = None,
        region: tuple[Sequence[int], Sequence[int]] | None = None,
        valid: Any = None,
        valid_times: Any = None,
        weights: Any = None,
        steps: int | None = None,
        start_step: int = 0,
        workers: int = 2,
        threads: int | None = None,
        pin: bool = True,
        buffers: int = 0,
        copy: bool = False,
        shared_memory: bool = False,
    ) -> None:
        srcs = _sources(sources)
        space = _space_spec(
            srcs, positions, seed, mode, stride, region, valid, valid_times, weights
        )
        labelled = space.pop("labelled")
        why_empty = space.pop("why_empty")
        prefetch_max = None
        if prefetch == "auto":
            prefetch, prefetch_max = 2, AUTO_PREFETCH_MAX
        elif isinstance(prefetch, str):
            raise ValueError(f"prefetch is a number of batches or 'auto', got {prefetch!r}")
        for what, value in (("batch_size", batch_size), ("prefetch", prefetch), ("workers", workers)):
            if int(value) < 1:
                raise ValueError(f"{what} must be at least 1, got {value}")
        if world_size < 1 or not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} of world size {world_size} is not valid")
        if steps is not None and steps < 0 or start_step < 0:
            raise ValueError("steps and start_step must not be negative")
        self._copy = bool(copy)
        self._names = [s.name for s in srcs]
        self._labels = _source_labels(srcs)
        self._seed, self._rank, self._world = int(seed), int(rank), int(world_size)
        self._batch_size = int(batch_size)
        self._start = int(start_step)
        self._steps = None if steps is None else int(steps)
        spec = {
            **space,
            "batch_size": self._batch_size,
            "start_step": self._start,
            "end_step": None if self._steps is None else self._start + self._steps,
            "rank": self._rank,
            "world_size": self._world,
            "prefetch": int(prefetch),
            "prefetch_max": prefetch_max,
            "buffers": int(buffers),
            "workers": int(workers),
            "threads": None if threads is None else int(threads),
            "pin": bool(pin),
            "shared_memory": bool(shared_memory),
        }
        self._native: NativeLoader | None = built(NativeLoader, spec, why_empty)
        check_grid(self._native.position_grid, space["positions"], labelled)
        self._dtypes = [_np_dtype(s["dtype"]) for s in self._native.sources]

    # --- iteration ------------------------------------------------------------------------

    def __iter__(self) -> Iterator[Batch]:
        return self

    def __next__(self) -> Batch:
        native = self._loader()
        batch = native.next()
        if batch is None:
            raise StopIteration
        return self._to_dict(batch)

    def _next_with_memory(self) -> tuple[Batch, tuple[int, int, list[int]] | None] | None:
        """The next batch and, with ``shared_memory``, its buffer's memory file: ``(fd, file
        size, offset of each source's bytes)``, the descriptor the loader's. None at the end."""
        batch = self._loader().next()
        if batch is None:
            return None
        return self._to_dict(batch), batch.shared_memory()

    def _to_dict(self, batch: NativeBatch) -> Batch:
        out: Batch = {}
        for s, name in enumerate(self._names):
            shape = tuple(int(n) for n in batch.shape(s))
            view = cast(Any, batch.view(s))  # exports the buffer protocol
            arr = np.frombuffer(view, dtype=self._dtypes[s]).reshape(shape)
            out[name] = arr.copy() if self._copy else arr
        out["meta"] = self._labelled(batch.samples())
        return out

    def _labelled(self, samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return _labelled(samples, self._labels)

    def __len__(self) -> int:
        """The number of steps of this loader (``steps``); a ``TypeError`` when endless."""
        if self._steps is None:
            raise TypeError("an endless loader (steps=None) has no length")
        return self._steps

    # --- state ----------------------------------------------------------------------------

    @property
    def step(self) -> int:
        """The step the next batch will be."""
        return int(self._loader().next_step)

    def state_dict(self) -> dict[str, int]:
        """Where this loader is: the next step, and what a resumed loader must match."""
        return {
            "step": self.step,
            "seed": self._seed,
            "rank": self._rank,
            "world_size": self._world,
            "batch_size": self._batch_size,
        }

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        """Resumes at ``state["step"]``: the next batch is exactly the one an uninterrupted
        run would have produced there. The seed, rank, world size and batch size must match."""
        for key, mine in (
            ("seed", self._seed),
            ("rank", self._rank),
            ("world_size", self._world),
            ("batch_size", self._batch_size),
        ):
            if key in state and int(state[key]) != mine:
                raise ValueError(f"state has {key}={state[key]}, this loader has {mine}")
        self.seek(int(state["step"]))

    def seek(self, step: int) -> None:
        """Restarts the stream at ``step`` (reads in flight are cancelled)."""
        if step < 0:
            raise ValueError("step must not be negative")
        self._loader().seek(step)

    # --- information ----------------------------------------------------------------------

    @property
    def sources(self) -> list[dict[str, Any]]:
        """Per source: ``name``, ``array``, ``crop``, ``dtype`` (delivered), ``element_size``."""
        return list(self._loader().sources)

    @property
    def batch_size(self) -> int:
        """Samples per batch on this rank."""
        return self._batch_size

    @property
    def epoch_len(self) -> int:
        """Allowed sample positions (the epoch length in epoch mode)."""
        return int(self._loader().epoch_len)

    @property
    def pin_state(self) -> dict[str, Any]:
        """Whether the ring buffers are page-locked / CUDA-registered, and why not."""
        return dict(self._loader().pin_state)

    @property
    def prefetch_depth(self) -> int:
        """Batches read ahead now: ``prefetch``, or where ``prefetch="auto"`` stands."""
        return int(self._loader().prefetch_depth)

    def plan(self, step: int) -> list[dict[str, Any]]:
        """The metadata of batch ``step``'s samples, without reading anything."""
        return self._labelled(list(self._loader().plan(step)))

    # --- lifetime -------------------------------------------------------------------------

    def _loader(self) -> NativeLoader:
        if self._native is None:
            raise ValueError("the loader is closed")
        return self._native

    def close(self) -> None:
        """Stops the background reads. Batches already delivered stay valid."""
        self._native = None

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"<Loader sources={self._names} batch_size={self._batch_size} seed={self._seed}>"


class Samples:
    """The loader's sample stream with random access: ``samples[i]`` is global sample ``i``, a
    pure function of the seed and ``i`` (the same sample as in a :class:`Loader` of the same
    sources and seed, whatever its batch size: batch ``k`` of a loader holds samples
    ``k * batch_size ...``). For frameworks that bring their own sampler and batching: a
    map-style dataset for ``torch.utils.data.DataLoader`` (numpy arrays, which its default
    collate stacks), and a data source for Grain (``grain.MapDataset.source(samples)`` or
    ``grain.DataLoader(data_source=samples, ...)``).

    ``samples[i]`` is a dict with one ``crop``-shaped array per source and ``"meta"``:
    ``index`` (``i``), ``position`` and, per source, ``origin`` (integer arrays), and
    ``epoch`` in epoch mode; :meth:`labels` gives an xarray source's coordinate labels.

    ``len(samples)`` is ``length``: required for uniform sampling (an endless stream), one
    epoch (every allowed lattice point once) by default in epoch mode. Reads release the GIL
    and may run from many threads at once. Pickles by its arguments (sources by path or URL),
    so it travels to spawned workers; works in forked ones too.
    """

    def __init__(
        self,
        sources: Any,
        *,
        positions: Sequence[str] | Mapping[str, Any] | None = None,
        seed: int = 0,
        mode: str = "uniform",
        stride: Sequence[int] | None = None,
        region: tuple[Sequence[int], Sequence[int]] | None = None,
        valid: Any = None,
        valid_times: Any = None,
        weights: Any = None,
        length: int | None = None,
    ) -> None:
        self._args: dict[str, Any] = {
            "sources": sources,
            "positions": positions,
            "seed": seed,
            "mode": mode,
            "stride": stride,
            "region": region,
            "valid": valid,
            "valid_times": valid_times,
            "weights": weights,
            "length": length,
        }
        srcs = _sources(sources)
        space = _space_spec(
            srcs, positions, seed, mode, stride, region, valid, valid_times, weights
        )
        labelled = space.pop("labelled")
        why_empty = space.pop("why_empty")
        spec = sampler_spec(space)
        self._native = built(NativeSampler, spec, why_empty)
        check_grid(self._native.position_grid, spec["positions"], labelled)
        self._names = [s.name for s in srcs]
        self._labels = _source_labels(srcs)
        self._epoch = mode == "epoch"
        sources_info = list(self._native.sources)
        self._dtypes = [_np_dtype(i["dtype"]) for i in sources_info]
        self._crops = [tuple(int(n) for n in i["crop"]) for i in sources_info]
        if length is None:
            if not self._epoch:
                raise ValueError(
                    "uniform sampling is an endless stream: give length= (the number of "
                    "samples len() reports)"
                )
            length = int(self._native.epoch_len)
        if int(length) < 0:
            raise ValueError(f"length must not be negative, got {length}")
        self._len = int(length)
        self._repr = (
            f"zcrop.Samples(sources=[{', '.join(_describe(s) for s in srcs)}], "
            f"positions={spec['positions']}, seed={int(seed)}, mode={mode!r}, "
            f"stride={spec['stride']}, region={spec['region']}, length={self._len})"
        )

    def __len__(self) -> int:
        return self._len

    def _index(self, i: Any) -> int:
        if not isinstance(i, (int, np.integer)):
            raise TypeError(f"sample indices are integers, got {type(i).__name__}")
        k = int(i) + self._len if int(i) < 0 else int(i)
        if not 0 <= k < self._len:
            raise IndexError(f"sample {int(i)} out of range for {self._len} samples")
        return k

    def __getitem__(self, i: int) -> dict[str, Any]:
        k = self._index(i)
        words = self._native.read(k)
        out: dict[str, Any] = {}
        for name, w, dtype, crop in zip(self._names, words, self._dtypes, self._crops):
            nbytes = int(np.prod(crop)) * dtype.itemsize
            out[name] = w.view(np.uint8)[:nbytes].view(dtype).reshape(crop)
        (plan,) = self._native.plan(k)
        meta: dict[str, Any] = {
            "index": k,
            "position": np.asarray(plan["position"], dtype=np.int64),
            "origin": {
                name: np.asarray(plan["sources"][name]["origin"], dtype=np.int64)
                for name in self._names
            },
        }
        if self._epoch:
            meta["epoch"] = int(plan["epoch"])
        out["meta"] = meta
        return out

    def labels(self, i: int) -> dict[str, dict[str, Any]]:
        """The coordinate labels of sample ``i``'s window, per xarray source and dimension
        (numpy datetime64 for times); no IO."""
        (plan,) = _labelled(list(self._native.plan(self._index(i))), self._labels)
        return {
            name: entry["labels"]
            for name, entry in plan["sources"].items()
            if "labels" in entry
        }

    def __getstate__(self) -> dict[str, Any]:
        return dict(self._args)

    def __setstate__(self, state: dict[str, Any]) -> None:
        args = dict(state)
        Samples.__init__(self, args.pop("sources"), **args)

    def __repr__(self) -> str:
        return self._repr


def _describe(src: Source) -> str:
    """A source as its array and crop (for reprs that identify a data source)."""
    arr = src._spec["array"]
    where = arr if isinstance(arr, str) else getattr(arr, "path", repr(arr))
    return f"{src.name}={where!r}{tuple(src._spec['crop'])}"


SourcesArg = Union[Source, Sequence[Source], Mapping[str, Source]]
