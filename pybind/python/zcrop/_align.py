"""Sample positions in coordinates, and sources aligned to them by their own labels.

Positions are labelled along a dimension either by the first xarray source that follows it
(its coordinate) or by the labels the loader is given (``positions={"time": t0_times}``). Every
xarray source that follows a labelled position dimension then takes its crop origin along it
from a table, one entry per position: the index its ``align`` rule picks in its own coordinate
for the position's label (shifted by a window start in label units), or ``-1`` where it has
none. The Rust sampler looks origins up in those tables and never draws a position where a
source has no alignment, so tables cost one integer per position along one dimension, never
one per position of the whole grid.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from zcrop._loader import Source

#: The alignment rules, as xarray's ``sel(method=...)`` names them where it has them.
RULES = ("exact", "nearest", "previous", "next")


def keys(labels: Any, what: str) -> np.ndarray[Any, Any]:
    """Labels as comparable numbers: datetimes and timedeltas as int64 nanoseconds (exact;
    float64 would round recent times to 256 ns), other numbers as float64."""
    a = np.asarray(labels)
    if a.dtype.kind in "mM":
        return a.astype(f"{a.dtype.kind}8[ns]").view(np.int64)
    if a.dtype.kind in "iuf":
        return a.astype(np.float64)
    raise TypeError(f"{what}: labels of dtype {a.dtype} cannot be aligned")


def delta(value: Any, like: np.ndarray[Any, Any], what: str) -> Any:
    """A window bound or tolerance in the units of ``like``'s labels (nanoseconds for times:
    a ``np.timedelta64``, ``datetime.timedelta``, ``pd.Timedelta`` or a string like "15min")."""
    if like.dtype.kind in "mM":
        if isinstance(value, str):
            # pandas parses "1h", "15min", "-2 days" (xarray depends on it).
            value = importlib.import_module("pandas").Timedelta(value)
        if isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(
            value, (bool, np.bool_)
        ):
            raise TypeError(
                f"{what}: {value!r} for a time coordinate; give a timedelta (e.g. "
                "np.timedelta64(1, 'h') or '1h')"
            )
        return int(np.timedelta64(value, "ns").astype(np.int64))
    if isinstance(value, (str, np.timedelta64)):
        raise TypeError(f"{what}: {value!r} for a numeric coordinate; give a number")
    return float(value)


def align_index(
    coord: np.ndarray[Any, Any],
    targets: np.ndarray[Any, Any],
    rule: str,
    tolerance: Any,
    what: str,
) -> np.ndarray[Any, Any]:
    """For each target label, the index ``rule`` picks in ``coord`` (strictly monotonic), or
    -1 where there is none within ``tolerance``: ``"exact"`` the equal label, ``"nearest"``
    the closest (ties to the larger label, as pandas), ``"previous"`` the largest label at or
    before the target, ``"next"`` the smallest at or after it."""
    c = keys(coord, what)
    q = targets
    n = len(c)
    if n == 0:
        return np.full(len(q), -1, dtype=np.int64)
    step = np.diff(c)
    if n > 1 and not ((step > 0).all() or (step < 0).all()):
        raise ValueError(f"{what}: the coordinate is not strictly monotonic")
    flip = n > 1 and step[0] < 0
    asc = c[::-1] if flip else c
    right = np.searchsorted(asc, q, side="right")  # asc[right - 1] <= q < asc[right]
    below = right - 1
    above = np.where((below >= 0) & (asc[np.clip(below, 0, n - 1)] == q), below, right)
    has_below = below >= 0
    has_above = above < n
    lo = asc[np.clip(below, 0, n - 1)]
    hi = asc[np.clip(above, 0, n - 1)]
    if rule == "exact":
        idx = np.where(has_below & (lo == q), below, -1)
    elif rule == "previous":
        idx = np.where(has_below, below, -1)
    elif rule == "next":
        idx = np.where(has_above, above, -1)
    elif rule == "nearest":
        d_lo = np.where(has_below, q - lo, np.inf)
        d_hi = np.where(has_above, hi - q, np.inf)
        idx = np.where(d_hi <= d_lo, above, below)
        idx = np.where(has_below | has_above, idx, -1)
    else:
        raise ValueError(f"{what}: align must be one of {RULES}, got {rule!r}")
    idx = idx.astype(np.int64)
    if tolerance is not None and rule != "exact":
        hit = idx >= 0
        gap = np.abs(asc[np.clip(idx, 0, n - 1)] - q)
        idx = np.where(hit & (gap <= tolerance), idx, -1)
    if flip:
        idx = np.where(idx >= 0, n - 1 - idx, -1)
    return idx


def regular_step(coord: np.ndarray[Any, Any], what: str) -> Any:
    """The spacing of a regularly spaced coordinate (an error where it is not regular)."""
    c = keys(coord, what)
    if len(c) < 2:
        raise ValueError(f"{what}: a window in label units needs at least two labels")
    d = np.diff(c)
    if c.dtype.kind == "i":
        regular = (d == d[0]).all()
    else:
        regular = np.allclose(d, d[0], rtol=1e-6, atol=0)
    if not regular or d[0] == 0:
        raise ValueError(
            f"{what}: a window in label units needs a regularly spaced coordinate; this one "
            f"is not (spacings {np.unique(d)[:4]} ...): give the window in steps (ints)"
        )
    return abs(d[0])


class Alignment:
    """How one dimension of an xarray source aligns with its position dimension: the rule,
    the tolerance (label units), the window start in label units (``shift``) and in steps
    (``offset``)."""

    __slots__ = ("offset", "rule", "shift", "tolerance")

    def __init__(self, rule: str, tolerance: Any, shift: Any, offset: int) -> None:
        self.rule, self.tolerance, self.shift, self.offset = rule, tolerance, shift, offset


def source_windows(
    name: str,
    dims: list[str],
    labels: Mapping[str, np.ndarray[Any, Any]],
    crop: dict[str, int],
    align: Any,
    tolerance: Any,
    window: Mapping[str, Any] | None,
    every: Mapping[str, int],
) -> dict[str, Alignment]:
    """The alignment of each dimension of xarray source ``name`` that has labels, and the crop
    sizes its windows give (written into ``crop``)."""
    def per_dim(value: Any, what: str) -> dict[str, Any]:
        if not isinstance(value, Mapping):
            return {d: value for d in dims}
        unknown = [d for d in value if d not in dims]
        if unknown:
            raise ValueError(
                f"source {name!r}: {what} names {unknown}, not dimensions of it ({dims})"
            )
        return dict(value)

    rules = per_dim("exact" if align is None else align, "align")
    tols = per_dim(tolerance, "tolerance")
    window = per_dim(window or {}, "window")
    out: dict[str, Alignment] = {}
    for d in dims:
        if d not in labels:
            if d in window:
                raise ValueError(
                    f"source {name!r}: a window along {d!r} needs a {d!r} coordinate; without "
                    "one give the crop size by crop= and the start by dims= (an int, or "
                    "zcrop.Dim.along(...).offset(k))"
                )
            continue
        what = f"source {name!r} dimension {d!r}"
        rule = str(rules.get(d, "exact"))
        if rule not in RULES:
            raise ValueError(f"{what}: align must be one of {RULES}, got {rule!r}")
        coord = np.asarray(labels[d])
        tol = tols.get(d)
        tol = None if tol is None else delta(tol, coord, f"{what} tolerance")
        if tol is not None and tol < 0:
            raise ValueError(f"{what}: the tolerance must not be negative")
        shift: Any = None
        offset = 0
        k = int(every.get(d, 1))
        if d in window:
            start, stop = window[d]
            if all(isinstance(x, (int, np.integer)) for x in (start, stop)):
                if stop <= start:
                    raise ValueError(f"{what}: the window ({start}, {stop}) is empty")
                offset = int(start)
                crop[d] = -(-(int(stop) - int(start)) // k)
            else:
                a = delta(start, coord, f"{what} window")
                b = delta(stop, coord, f"{what} window")
                if b < a:
                    raise ValueError(f"{what}: the window ({start}, {stop}) ends before it starts")
                step = regular_step(coord, what)
                shift = a
                crop[d] = int((b - a) // (step * k)) + 1
        out[d] = Alignment(rule, tol, shift, offset)
    return out


Dims = list[tuple[Any, ...]]


def resolved_dims(srcs: list[Source], names: list[str]) -> list[Dims | None]:
    """Each source's dims spec; where none was given, dimensions named like positions follow
    them and the others start at 0 (``None`` where the sampler decides, for arrays without
    dimension names)."""
    out: list[Dims | None] = []
    for src in srcs:
        dims = src._spec["dims"]
        if dims is None and src._axis_names is not None:
            dims = [
                ("pick", src._picks[a])
                if a in src._picks
                else ("along", d, 1, 1, 0, 0, k)
                if d in names
                else ("fixed", 0, k)
                for a, (d, k) in enumerate(zip(src._axis_names, src._every))
            ]
            if all(spec[0] == "fixed" for spec in dims):
                raise ValueError(
                    f"source {src.name!r}: none of its dimensions {src._axis_names} is a "
                    f"position dimension ({names})"
                )
        out.append(dims)
    return out


def position_labels(
    srcs: list[Source],
    dims: list[Dims | None],
    names: list[str],
    positions: Mapping[str, Any] | None,
) -> tuple[dict[str, np.ndarray[Any, Any]], dict[str, tuple[int, int]]]:
    """The labels of each labelled position dimension, and the index ranges that label slices
    of ``positions`` restrict it to."""
    from zcrop._fields import _position_labels

    labels = _position_labels(srcs, dims, names)
    ranges: dict[str, tuple[int, int]] = {}
    for d, given in (positions or {}).items():
        if given is None:
            continue
        if isinstance(given, slice):
            if given.step is not None:
                raise ValueError(f"positions[{d!r}]: a label slice takes no step")
            if d not in labels:
                raise ValueError(
                    f"positions[{d!r}] is a label slice, but no xarray source follows {d!r} "
                    "to label it"
                )
            ranges[d] = _slice_range(labels[d], given, d)
            continue
        values = np.asarray(given)
        if values.ndim != 1 or len(values) == 0:
            raise ValueError(f"positions[{d!r}] must be a slice or a non-empty 1-d list of labels")
        ref = labels.get(d)
        if ref is not None and ref.dtype.kind == "M":
            values = values.astype(ref.dtype)
        elif values.dtype.kind in "OU":
            values = values.astype("datetime64[ns]")
        labels[d] = values
    return labels, ranges


def _slice_range(coord: np.ndarray[Any, Any], s: slice, d: str) -> tuple[int, int]:
    """The index range of the labels in ``[s.start, s.stop]`` (inclusive, as ``sel``)."""
    what = f"positions[{d!r}]"
    c = keys(coord, what)
    kind = np.asarray(coord).dtype
    flip = len(c) > 1 and c[1] < c[0]
    asc = c[::-1] if flip else c
    # Bounds as the same numbers as the labels (exact nanoseconds for times).
    bounds = [None if v is None else keys(np.asarray([v]).astype(kind), what)[0]
              for v in (s.start, s.stop)]
    lo_v, hi_v = bounds
    if flip:
        # sel on a descending coordinate takes slice(high, low).
        lo_v, hi_v = hi_v, lo_v
    a = 0 if lo_v is None else int(np.searchsorted(asc, lo_v, side="left"))
    b = len(c) if hi_v is None else int(np.searchsorted(asc, hi_v, side="right"))
    lo_i, hi_i = (len(c) - b, len(c) - a) if flip else (a, b)
    if hi_i <= lo_i:
        raise ValueError(f"positions[{d!r}] = {s} selects no label of the coordinate")
    return lo_i, hi_i


def lookup_dims(
    srcs: list[Source],
    resolved: list[Dims | None],
    names: list[str],
    labels: Mapping[str, np.ndarray[Any, Any]],
    explicit: set[str],
) -> list[Dims | None]:
    """Each source's dims with a lookup table for every dimension aligned by labels."""
    out: list[Dims | None] = []
    for src, dims in zip(srcs, resolved):
        if dims is None:
            if explicit:
                _check_by_index(src, names, explicit)
            out.append(None)
            continue
        new = []
        for axis, spec in enumerate(dims):
            pos = str(spec[1])
            if spec[0] == "fixed":
                new.append(_fixed_window(src, axis, spec))
                continue
            if spec[0] != "along" or pos not in labels:
                new.append(spec)
                continue
            dim = src._dim_names[axis] if src._dim_names is not None else None
            how = src._align.get(dim) if dim is not None else None
            if how is None or dim is None:
                if pos in explicit:
                    raise _by_index(src.name, pos)
                new.append(spec)
                continue
            _, _, num, den, offset, jitter = spec[:6]
            every = spec[6] if len(spec) > 6 else 1
            if (num, den) != (1, 1):
                raise ValueError(
                    f"source {src.name!r} dimension {dim!r} has a scale ({num}/{den}) and "
                    "coordinate labels: it aligns by its labels, so drop the scale"
                )
            what = f"source {src.name!r} dimension {dim!r}"
            target = keys(labels[pos], f"positions[{pos!r}]")
            coord = np.asarray(src._labels[dim])
            if (coord.dtype.kind == "M") != (np.asarray(labels[pos]).dtype.kind == "M"):
                raise TypeError(f"{what}: its labels and the positions' {pos!r} labels differ in kind")
            if how.shift is not None:
                target = target + how.shift
            if src._wrap == axis:
                table = _periodic_index(coord, target, how, what)
            else:
                table = align_index(coord, target, how.rule, how.tolerance, what)
            if (table < 0).all():
                tol = "" if how.tolerance is None else f" within tolerance {how.tolerance}"
                raise ValueError(
                    f"{what}: no position's {pos!r} label has a {how.rule!r} match in its "
                    f"coordinate{tol} ({coord[0]} .. {coord[-1]}; positions "
                    f"{np.asarray(labels[pos])[0]} .. {np.asarray(labels[pos])[-1]})"
                )
            new.append(("lookup", pos, table, int(offset) + how.offset, int(jitter), int(every)))
        out.append(new)
    return out


def _periodic_index(
    coord: np.ndarray[Any, Any], target: np.ndarray[Any, Any], how: Alignment, what: str
) -> np.ndarray[Any, Any]:
    """:func:`align_index` along a periodic coordinate (longitude): targets are taken modulo
    the period (the spacing times the length), so labels in -180..180 find their place in
    0..360 and back, and the label after the last is the first again (for "nearest" across
    the seam)."""
    c = keys(coord, what)
    if c.dtype.kind != "f" or len(c) < 2 or c[1] < c[0]:
        raise ValueError(f"{what}: a periodic coordinate must be numeric and ascending")
    period = regular_step(coord, what) * len(c)
    wrapped = (np.asarray(target, dtype=np.float64) - c[0]) % period + c[0]
    # Snap values a rounding error below a label's period image back onto it.
    wrapped = np.where(np.isclose(wrapped, c[0] + period), c[0], wrapped)
    extended = np.append(c, c[0] + period)
    idx = align_index(extended, wrapped, how.rule, how.tolerance, what)
    return np.where(idx == len(c), 0, idx)


def _fixed_window(src: Source, axis: int, spec: tuple[Any, ...]) -> tuple[Any, ...]:
    """A fixed dimension's spec with its window's start (in steps) added to its origin."""
    dim = src._dim_names[axis] if src._dim_names is not None else None
    how = src._align.get(dim) if dim is not None else None
    if how is None or (how.shift is None and how.offset == 0):
        return spec
    what = f"source {src.name!r} dimension {dim!r}"
    if how.shift is not None:
        raise ValueError(
            f"{what} follows no position, so a window in label units has nothing to be "
            "relative to: give it in steps (ints from the first element)"
        )
    start = int(spec[1]) + how.offset
    if start < 0:
        raise ValueError(f"{what}: the window starts at {start}, before the array")
    return ("fixed", start, *spec[2:])


def _by_index(name: str, pos: str) -> ValueError:
    return ValueError(
        f"source {name!r} follows position {pos!r} by index, but the positions along {pos!r} "
        "are given as labels: give it as a variable of an xarray Dataset (opened with "
        "engine='zcrop') so it aligns by its coordinate"
    )


def _check_by_index(src: Source, names: list[str], explicit: set[str]) -> None:
    """A source placed by the sampler (by dimension names, else in order) must not follow a
    position dimension given as labels."""
    from zcrop._array import Array
    from zcrop._loader import _dimension_names, _open_native

    arr = src._spec["array"]
    if isinstance(arr, str):
        arr = _open_native(arr, src._spec["storage_options"])
    try:
        followed = set(_dimension_names(Array(arr), None)) & set(names)
    except ValueError:
        followed = set(names)  # no names: it follows the positions in order
    hit = sorted(followed & explicit)
    if hit:
        raise _by_index(src.name, hit[0])


def alignment_conflict(
    srcs: list[Source], dims: list[Dims | None], labels: Mapping[str, np.ndarray[Any, Any]]
) -> str | None:
    """Why no position is left, where the sources' alignments are the reason: along some
    position dimension each source aligns (whole crops inside its array) at some positions,
    but no position suits them all. ``dims``: the sources' dims with lookup tables. None when
    the alignments leave a position along every dimension (masks, weights or the lattice
    emptied the space then)."""
    allowed: dict[str, list[tuple[str, np.ndarray[Any, Any]]]] = {}
    for src, spec in zip(srcs, dims):
        if spec is None or src._dim_names is None:
            continue
        for axis, d in enumerate(spec):
            if d[0] != "lookup":
                continue
            _, pos, table, offset, jitter, every = d[:6]
            dim = src._dim_names[axis]
            # As the sampler admits a table entry: an origin whose crop (and jitter) fits.
            ok = np.asarray(table) >= 0
            if src._wrap != axis and axis not in src._pad:
                o = np.asarray(table, dtype=np.int64) + int(offset)
                span = (int(src._spec["crop"][axis]) - 1) * int(every) + 1
                ok &= (o - int(jitter) >= 0) & (o + int(jitter) + span <= len(src._labels[dim]))
            rule = src._align[dim].rule if dim in src._align else "exact"
            allowed.setdefault(str(pos), []).append(
                (f"source {src.name!r} dimension {dim!r} (align {rule!r})", ok)
            )
    for pos, entries in allowed.items():
        if len(entries) < 2 or any(not ok.any() for _, ok in entries):
            continue  # one source alone leaves nothing: the sampler's error names it
        if np.logical_and.reduce([ok for _, ok in entries]).any():
            continue
        # Name the first two that share no position, else all of them.
        pair = next(
            (
                [a, b]
                for i, a in enumerate(entries)
                for b in entries[i + 1 :]
                if not (a[1] & b[1]).any()
            ),
            entries,
        )
        where = np.asarray(labels[pos]) if pos in labels else None
        parts = []
        for what, ok in pair:
            hits = np.flatnonzero(ok)
            shown = _shown(where[hits[:3]]) if where is not None else [str(h) for h in hits[:3]]
            more = ", ..." if len(hits) > 3 else ""
            parts.append(
                f"{what} aligns at {len(hits)} of {len(ok)} positions ({', '.join(shown)}{more})"
            )
        return (
            f"no sample position: the sources' alignments along position dimension {pos!r} "
            f"have no position in common: {'; '.join(parts)}. Loosen an align rule or "
            "tolerance, or move a window"
        )
    return None


def _shown(values: np.ndarray[Any, Any]) -> list[str]:
    """Labels as short strings (times in the coarsest unit that shows them all exactly)."""
    if values.dtype.kind == "M":
        unit = next(
            u
            for u in ("D", "m", "s", "ms", "us", "ns")
            if (values.astype(f"M8[{u}]") == values).all()
        )
        return [str(v) for v in values.astype(f"M8[{unit}]")]
    return [str(v) for v in values.tolist()]
