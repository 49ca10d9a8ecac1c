"""``zcrop.valid_windows``: where every source's window is free of NaN and fill values.

One streaming pass over the data. Positions are processed in slabs along the first position
dimension, sized to a memory budget; each source reads only the rows (along the array axis that
follows that dimension) it has not read yet, in whole chunks, so every chunk is read once. The
next slabs' reads run in a background thread while the current slab is checked; a read tests
each value for being missing as it decodes it (in Rust, without the GIL), reducing over the
axes a window takes whole, and never writes the values out. The check is a window test along
each window axis (a second kernel, also without the GIL), then a gather of each position's
window. The result over positions is kept as runs of valid positions, never one
byte per position for the whole grid.

Along a periodic first position dimension the rows are those of the unrolled axis: windows of
the last positions continue into the first rows, which are read again at the end. Along a
padded dimension the map is extended with valid elements as far as windows pass the ends.

The result is cached in a small file keyed by the data's identity (each array's metadata and,
for local stores, the sizes and modification times of its files), the sources' crops and
placement, and the values counted as invalid, so the second call returns at once.
"""

from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import json
import math
import os
import re
import sys
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from zcrop._api import is_url
from zcrop._array import Array
from zcrop._fields import ValidMask, _runs
from zcrop._loader import _open_native, _sources, _space_spec, built, sampler_spec
from zcrop import _zcrop
from zcrop._zcrop import NativeSampler

__all__ = ["valid_windows"]

#: Below this, a window start stands for "no origin here" (a position a table does not align).
_NONE = -(1 << 61)

#: Bytes of a slab's reads and intermediate maps, all sources together, by default.
DEFAULT_BUDGET = 512 << 20

#: Slabs whose reads are queued while one is checked.
_AHEAD = 2


def _size(v: int | str) -> int:
    """A byte count: an int, or a string such as ``"512M"``, ``"2GiB"``."""
    if isinstance(v, (int, np.integer)):
        return int(v)
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", str(v).lower())
    if not m:
        raise ValueError(f"budget must be a byte count or a size such as '512M', got {v!r}")
    return int(float(m.group(1)) * 1024 ** " kmgt".index(m.group(2) or " "))


@dataclass
class _Axis:
    """A source axis whose origin follows a position dimension."""

    axis: int
    position: int
    num: int
    den: int
    offset: int
    jitter: int
    crop: int
    size: int
    #: Origins looked up per position (-1: no alignment), for a source aligned by labels.
    table: np.ndarray[Any, Any] | None = None
    #: The step between the elements a crop takes.
    every: int = 1
    #: The array is periodic along the axis: windows wrap around its end.
    wrap: bool = False
    #: Windows may pass the array's ends (padded): what lies outside is not missing.
    pad: bool = False

    def origins(self, positions: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
        """Crop origins at ``positions`` (a large negative number where there is none)."""
        if self.table is None:
            return positions * self.num // self.den + self.offset
        t = self.table[positions]
        return np.where(t >= 0, t + self.offset, -(1 << 62))

    @property
    def window(self) -> int:
        """Elements whose missing values the kernel reduces along the axis: the whole crop
        and jitter, or for a stepped crop the jitter only (the steps are taken after)."""
        if self.every > 1:
            return 2 * self.jitter + 1
        return self.crop + 2 * self.jitter

    @property
    def span(self) -> int:
        """Elements a window spans along the axis, jitter included."""
        return (self.crop - 1) * self.every + 1 + 2 * self.jitter


@dataclass
class _Plan:
    """One source: its array, how its axes follow positions, and the values that are invalid."""

    name: str
    array: Array
    aligned: list[_Axis]
    #: Per fixed axis, the slice (or the picked indices) its crops take.
    fixed: dict[int, slice | list[int]]
    fills: list[float]
    lead: _Axis | None


def _plans(sampler: NativeSampler, srcs: list[Any], invalid: Any) -> list[_Plan]:
    plans = []
    for src, info in zip(srcs, sampler.sources):
        spec = src._spec
        arr = spec["array"]
        array = Array(arr if not isinstance(arr, str) else _open_native(arr, spec["storage_options"]))
        if array.dtype.kind not in "biuf":
            raise TypeError(
                f"source {src.name!r}: valid_windows checks numeric arrays, {array.name} is "
                f"{array.dtype}"
            )
        aligned: list[_Axis] = []
        fixed: dict[int, slice | list[int]] = {}
        for axis, rule in enumerate(info["origins"]):
            crop = int(info["crop"][axis])
            every = int(info["every"][axis])
            picks = info["picks"][axis]
            if picks is not None:
                fixed[axis] = [int(i) for i in picks]
            elif rule[0] == "fixed":
                o = int(rule[1])
                fixed[axis] = slice(o, o + (crop - 1) * every + 1, every)
            elif rule[0] == "lookup":
                _, pos, table, offset, jitter = rule[:5]
                aligned.append(
                    _Axis(axis, int(pos), 1, 1, int(offset), int(jitter), crop,
                          int(array.shape[axis]), np.asarray(table, dtype=np.int64), every)
                )
            else:
                _, pos, num, den, offset, jitter = rule[:6]
                aligned.append(
                    _Axis(axis, int(pos), int(num), int(den), int(offset), int(jitter), crop,
                          int(array.shape[axis]), None, every)
                )
        fills = [] if spec["decode"] is None else [float(f) for f in spec["decode"][2]]
        extra = invalid.get(src.name, []) if isinstance(invalid, dict) else (invalid or [])
        fills += [float(v) for v in np.atleast_1d(extra)]
        if info["wrap"] is not None:
            for a in aligned:
                a.wrap = a.axis == int(info["wrap"])
        for a in aligned:
            a.pad = bool(info["pad"][a.axis])
            if a.wrap and a.table is not None:
                a.table = _unrolled(a.table, a.size)
        lead = next((a for a in aligned if a.position == 0), None)
        plans.append(_Plan(src.name, array, aligned, fixed, sorted(set(fills)), lead))
    return plans


def _unrolled(table: np.ndarray[Any, Any], size: int) -> np.ndarray[Any, Any]:
    """A periodic lookup table made non-decreasing across the seam: each entry that drops by
    more than half the period from the one before starts a new period (``+ size``), so the
    windows of consecutive positions are consecutive rows of the unrolled axis."""
    out = table.copy()
    at = np.flatnonzero(out >= 0)
    if len(at) > 1:
        seams = np.concatenate([[0], np.cumsum(np.diff(out[at]) < -(size // 2))])
        out[at] += seams * size
    return out


def _identity(array: Array) -> dict[str, Any]:
    """What identifies an array's data: its metadata and, for a local store, the count, sizes
    and modification times of its files."""
    ident: dict[str, Any] = {"uri": array.native.uri, "metadata": array.native.metadata_json}
    if not is_url(array.native.uri):
        h = hashlib.sha256()
        count = 0
        for root, _, files in sorted(os.walk(array.native.uri)):
            for f in sorted(files):
                st = os.stat(os.path.join(root, f))
                h.update(f"{root}/{f}:{st.st_size}:{st.st_mtime_ns};".encode())
                count += 1
        ident["files"] = [count, h.hexdigest()]
    return ident


def _cache_key(
    names: list[str], grid: list[int], plans: list[_Plan], infos: list[dict[str, Any]]
) -> str:
    """What a cached mask depends on: the positions, and per source the data's identity, how
    its windows are placed and taken (lookup tables by their bytes), and the invalid values."""

    def exact(v: Any) -> Any:
        if isinstance(v, np.ndarray):
            return hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()
        if isinstance(v, (list, tuple)):
            return [exact(x) for x in v]
        return v

    sources = [
        {
            "array": _identity(p.array),
            **{k: exact(info[k]) for k in ("origins", "crop", "every", "picks", "wrap", "pad")},
            "fills": p.fills,
        }
        for p, info in zip(plans, infos)
    ]
    blob = {"version": 2, "positions": names, "grid": grid, "sources": sources}
    return hashlib.sha256(json.dumps(blob, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _cache_dir(cache: bool | str | os.PathLike[str]) -> str | None:
    if cache is False:
        return None
    if cache is True:
        base = os.environ.get("ZCROP_CACHE") or os.path.join(
            os.path.expanduser("~"), ".cache", "zcrop"
        )
        return os.path.join(base, "masks")
    return os.fspath(cache)


def _window_any(inv: np.ndarray[Any, Any], windows: list[int]) -> np.ndarray[Any, Any]:
    """``out[k]``: whether the window of ``windows[d]`` elements along each axis ``d`` starting
    at ``k`` holds a True (the Rust kernel, without the GIL)."""
    flat = np.ascontiguousarray(inv, dtype=bool).reshape(-1)
    out, shape = _zcrop.window_any(flat, list(inv.shape), windows)
    return out.reshape(shape)


class _Reader:
    """One source's invalid-element map over its aligned axes, extended row by row along the
    axis that follows position dimension 0 (the whole array when none does)."""

    def __init__(self, plan: _Plan) -> None:
        self.plan = plan
        self.lo = 0  # first row held along the lead axis
        self.rows: np.ndarray[Any, Any] | None = None
        # Inner chunks: a slab may end inside a shard, whose other chunks the next slab reads.
        self.step = int(plan.array.chunks[plan.lead.axis]) if plan.lead else 0

    def read(self, a: int, b: int) -> np.ndarray[Any, Any]:
        """The reduced invalid map of rows ``[a, b)`` along the lead axis (all rows when the
        source has no lead axis): bool over the aligned axes, in array order."""
        p = self.plan
        if p.lead is not None and p.lead.wrap and (a < 0 or b > p.lead.size):
            # Rows of the unrolled periodic axis: read each period's piece.
            pieces = []
            row = a
            while row < b:
                start = row % p.lead.size
                stop = start + min(p.lead.size - start, b - row)
                pieces.append(self.read(start, stop))
                row += stop - start
            return np.concatenate(pieces, axis=self._lead_index())
        block: list[tuple[int, int] | np.ndarray[Any, Any]] = []
        for axis, size in enumerate(p.array.shape):
            if axis in p.fixed:
                fixed = p.fixed[axis]
                picks = range(size)[fixed] if isinstance(fixed, slice) else fixed
                block.append(np.asarray(picks, dtype=np.uint64))
            elif p.lead is not None and axis == p.lead.axis:
                block.append((a, b - a))
            else:
                block.append((0, int(size)))
        # The values are tested as they are decoded (in Rust, without the GIL), never written.
        keep = [axis not in p.fixed for axis in range(len(block))]
        out, shape = p.array._native.missing_map(block, p.array.dtype.name, p.fills, keep)
        return out.reshape(shape)

    def extend(self, a: int, b: int, rows: np.ndarray[Any, Any]) -> None:
        """Holds rows ``[a_keep, b)``: the new ``rows`` (``[a, b)``) after what is kept."""
        lead = self._lead_index()
        if self.rows is None or self.rows.shape[lead] == 0:
            self.rows, self.lo = rows, a
        else:
            self.rows = np.concatenate([self.rows, rows], axis=lead)

    def drop_before(self, row: int) -> None:
        lead = self._lead_index()
        if self.rows is not None and row > self.lo:
            cut = min(row - self.lo, self.rows.shape[lead])
            keep: list[slice] = [slice(None)] * self.rows.ndim
            keep[lead] = slice(cut, None)
            self.rows = self.rows[tuple(keep)]  # a view; the next extend copies once
            self.lo += cut

    def _lead_index(self) -> int:
        p = self.plan
        return [a.axis for a in p.aligned].index(p.lead.axis) if p.lead else 0


def _slabs(plans: list[_Plan], grid: list[int], budget: int) -> Iterator[tuple[int, int]]:
    """Position slabs ``[p0, p1)`` along position dimension 0 whose reads fit ``budget``."""
    n0 = grid[0]
    rest = math.prod(grid[1:])
    per_position = rest * 2  # the slab's validity and one source map
    for p in plans:
        if p.lead is None:
            continue
        row = math.prod(
            n if ax != p.lead.axis else 1
            for ax, n in enumerate(
                [_taken(p.fixed[a], s) if a in p.fixed else s for a, s in enumerate(p.array.shape)]
            )
        )
        # Boolean maps and running sums per row, and the maps of the reads queued ahead, scaled
        # to positions (a read never holds the values themselves).
        per_row = row * (6 + _AHEAD)
        per_position += per_row * max(1, p.lead.num // max(1, p.lead.den))
    # At least a few slabs, so that reading one overlaps checking the one before.
    step = max(1, min(budget // max(1, per_position), -(-n0 // 4)))
    p0 = 0
    while p0 < n0:
        yield p0, min(n0, p0 + step)
        p0 += step


def _taken(sel: slice | list[int], size: int) -> int:
    """Elements a fixed axis's selection takes."""
    return len(sel) if isinstance(sel, list) else len(range(*sel.indices(size)))


def _rows_for(p: _Plan, p0: int, p1: int) -> tuple[int, int]:
    """Rows along the lead axis the windows of positions ``[p0, p1)`` span (rows of the unrolled
    axis, which pass its ends, for a periodic one)."""
    lead = p.lead
    assert lead is not None
    if lead.table is None:
        # Origins grow with the position: the ends of the slab bound them.
        o = lead.origins(np.array([p0, p1 - 1]))
    else:
        o = lead.origins(np.arange(p0, p1))
        o = o[o > _NONE]
        if not len(o):
            return 0, 0
    first, last = int(o.min()), int(o.max())
    if lead.wrap:
        return first - lead.jitter, last - lead.jitter + lead.span
    return max(0, first - lead.jitter), min(lead.size, last - lead.jitter + lead.span)


def _source_valid(
    p: _Plan, reader: _Reader, grid: list[int], p0: int, p1: int
) -> np.ndarray[Any, Any]:
    """Whether each position of the slab has a clean window of source ``p``: bool over
    ``(p1 - p0, *grid[1:])``, broadcast over position dimensions the source does not follow."""
    inv = reader.rows
    out_shape = [p1 - p0, *grid[1:]]
    if inv is None:
        # Nothing read yet: no position of the slab has an origin in this source.
        return np.zeros(out_shape, dtype=bool)
    take = []
    for k, ax in enumerate(p.aligned):
        if ax.wrap and ax is not p.lead:
            # Windows continue at the start: append the first elements they reach. (Along
            # the lead axis the reader holds rows of the unrolled axis already.)
            reach = ax.span - 1
            more: list[Any] = [slice(None)] * inv.ndim
            more[k] = np.arange(reach) % max(inv.shape[k], 1)
            inv = np.concatenate([inv, inv[tuple(more)]], axis=k)
    for ax in p.aligned:
        base = reader.lo if p.lead is not None and ax is p.lead else 0
        span = grid[ax.position] if ax.position else p1 - p0
        first = p0 if ax.position == 0 else 0
        starts = ax.origins(np.arange(first, first + span, dtype=np.int64)) - ax.jitter - base
        if ax.wrap and ax is not p.lead:
            starts = np.where(starts > _NONE, starts % ax.size, starts)
        take.append(starts)
    for k, ax in enumerate(p.aligned):
        if ax.pad:
            inv, take[k] = _padded(inv, k, take[k], ax, reader if ax is p.lead else None)
    bad = _window_any(inv, [ax.window for ax in p.aligned])
    for k, ax in enumerate(p.aligned):
        if ax.every > 1:
            bad = _stepped_any(bad, k, ax.crop, ax.every)
    # Positions whose window falls outside the held rows or the array are not valid. Where
    # positions map one to one onto consecutive windows (the usual case), the inside ones are
    # a block of positions and their windows a block of ``bad``: one slice each, no gather.
    dest: list[slice] = []
    src: list[slice] = []
    for k, starts in enumerate(take):
        n = bad.shape[k]
        if not (len(starts) and (np.diff(starts) == 1).all()):
            break
        lo = int(min(max(-starts[0], 0), len(starts)))
        hi = int(max(min(n - starts[0], len(starts)), lo))
        dest.append(slice(lo, hi))
        src.append(slice(int(starts[0]) + lo, int(starts[0]) + hi))
    if len(dest) == len(take):
        valid = np.zeros([len(t) for t in take], dtype=bool)
        valid[tuple(dest)] = ~bad[tuple(src)]
    else:
        inside = [(t >= 0) & (t < bad.shape[k]) for k, t in enumerate(take)]
        if any(n == 0 for n in bad.shape):
            valid = np.zeros([len(t) for t in take], dtype=bool)
        else:
            clipped = [np.clip(t, 0, bad.shape[k] - 1) for k, t in enumerate(take)]
            valid = ~bad[np.ix_(*clipped)] & _outer_and(inside)
    # Arrange the source's aligned axes in position order, broadcast the others.
    order = sorted(range(len(p.aligned)), key=lambda k: p.aligned[k].position)
    valid = valid.transpose(order)
    shape = [1] * len(grid)
    for k in order:
        shape[p.aligned[k].position] = valid.shape[order.index(k)]
    return np.broadcast_to(valid.reshape(shape), out_shape)


def _padded(
    inv: np.ndarray[Any, Any],
    k: int,
    starts: np.ndarray[Any, Any],
    ax: _Axis,
    lead: _Reader | None,
) -> tuple[np.ndarray[Any, Any], np.ndarray[Any, Any]]:
    """The invalid map extended along its axis ``k`` (padded) with valid elements as far as
    the windows at ``starts`` pass the array's ends, and the starts in the extended map. Along
    the lead axis only an end of the array that the held rows reach is extended."""
    known = starts[starts > _NONE]
    if not len(known):
        return inv, starts
    held = inv.shape[k]
    at_start = lead is None or lead.lo == 0
    at_end = lead is None or lead.lo + held >= ax.size
    before = max(0, -int(known.min())) if at_start else 0
    after = max(0, int(known.max()) + ax.span - held) if at_end else 0
    if before == after == 0:
        return inv, starts
    widths = [(0, 0)] * inv.ndim
    widths[k] = (before, after)
    return np.pad(inv, widths, constant_values=False), np.where(
        starts > _NONE, starts + before, starts
    )


def _stepped_any(bad: np.ndarray[Any, Any], axis: int, n: int, k: int) -> np.ndarray[Any, Any]:
    """``out[i] = any(bad[i + j * k] for j < n)`` along ``axis``: windows of ``n`` elements
    ``k`` apart."""
    length = bad.shape[axis] - (n - 1) * k
    if length <= 0:
        shape = list(bad.shape)
        shape[axis] = 0
        return np.zeros(shape, dtype=bool)
    index: list[slice] = [slice(None)] * bad.ndim
    index[axis] = slice(0, length)
    out = bad[tuple(index)].copy()
    for j in range(1, n):
        index[axis] = slice(j * k, j * k + length)
        out |= bad[tuple(index)]
    return out


def _outer_and(masks: list[np.ndarray[Any, Any]]) -> np.ndarray[Any, Any]:
    out = masks[0]
    for m in masks[1:]:
        out = out[..., None] & m
    return out


def valid_windows(
    sources: Any,
    positions: Sequence[str] | None = None,
    *,
    invalid: Any = None,
    budget: int | str = DEFAULT_BUDGET,
    cache: bool | str | os.PathLike[str] = True,
    progress: bool | None = None,
) -> ValidMask:
    """The sample positions where every source's window is free of NaN and fill values: a
    :class:`zcrop.ValidMask` to pass as ``valid=`` to :class:`zcrop.Loader` or
    :class:`zcrop.Samples` with the same sources and positions.

    Parameters
    ----------
    sources:
        The loader's sources (a :class:`zcrop.Source`, a list or a dict of them): their crops,
        dimensions and jitter define each window (a jittered window counts every origin the
        jitter can reach).
    positions:
        The position dimensions, as given to the loader.
    invalid:
        Values that count as missing besides NaN and an xarray source's ``_FillValue`` /
        ``missing_value`` (e.g. ``[0]`` for nodata zeros): a list for every source, or a
        dict ``{source name: [values]}``.
    budget:
        Bytes that one slab of reads and maps may take (an int or a size such as ``"2G"``).
    cache:
        ``True`` keeps the result in ``$ZCROP_CACHE/masks`` (default ``~/.cache/zcrop/masks``)
        keyed by the data's identity, a directory path keeps it there, ``False`` not at all.
    progress:
        Print progress to stderr (default: when stderr is a terminal).
    """
    srcs = _sources(sources)
    space = _space_spec(srcs, positions, 0, "uniform", None, None)
    names = space["positions"]
    space.pop("labelled")
    why_empty = space.pop("why_empty")
    sampler = built(NativeSampler, sampler_spec(space), why_empty)
    grid = [int(g) for g in sampler.position_grid]
    plans = _plans(sampler, srcs, invalid)
    budget = _size(budget)

    where = _cache_dir(cache)
    path = None
    if where is not None:
        path = os.path.join(where, f"valid-{_cache_key(names, grid, plans, sampler.sources)}.npz")
        if os.path.exists(path):
            with np.load(path) as f:
                return ValidMask(names, grid, [1] * len(grid), f["runs"])

    show = sys.stderr.isatty() if progress is None else bool(progress)
    rest = math.prod(grid[1:])
    readers = [_Reader(p) for p in plans]
    for r in readers:
        if r.plan.lead is None:
            r.extend(0, 0, r.read(0, 0))
    slabs = list(_slabs(plans, grid, budget))

    def reads_for(i: int) -> list[tuple[int, int, np.ndarray[Any, Any] | None]]:
        """New rows each source needs for slab ``i`` (whole chunks, from where it stopped)."""
        p0, p1 = slabs[i]
        out: list[tuple[int, int, np.ndarray[Any, Any] | None]] = []
        for r, done in zip(readers, held):
            if r.plan.lead is None:
                out.append((0, 0, None))
                continue
            a, b = _rows_for(r.plan, p0, p1)
            start = max(a, done[0])
            to_chunk = -(-b // r.step) * r.step
            end = b if b <= done[0] else to_chunk if r.plan.lead.wrap else min(
                r.plan.lead.size, to_chunk
            )
            if end <= start:
                out.append((start, start, None))
                continue
            done[0] = end
            out.append((start, end, r.read(start, end)))
        return out

    held = [[_NONE] for _ in readers]
    runs: list[np.ndarray[Any, Any]] = []
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
        # Reads run up to _AHEAD slabs ahead, one after the other, so zcrop's threads decode
        # while this thread checks a slab.
        pending = collections.deque(pool.submit(reads_for, i) for i in range(min(_AHEAD, len(slabs))))
        for i, (p0, p1) in enumerate(slabs):
            got = pending.popleft().result()
            if i + _AHEAD < len(slabs):
                pending.append(pool.submit(reads_for, i + _AHEAD))
            ok: np.ndarray[Any, Any] | None = None
            for r, (a, b, rows) in zip(readers, got):
                if r.plan.lead is not None:
                    if rows is not None:
                        r.extend(a, b, rows)
                    r.drop_before(_rows_for(r.plan, p0, p1)[0])
                this = _source_valid(r.plan, r, grid, p0, p1)
                ok = this if ok is None else ok & this
            assert ok is not None
            slab_runs = _runs(ok.ravel()) + np.uint64(p0 * rest)
            if runs and len(slab_runs) and runs[-1][-1, 1] == slab_runs[0, 0]:
                runs[-1][-1, 1] = slab_runs[0, 1]
                slab_runs = slab_runs[1:]
            if len(slab_runs):
                runs.append(slab_runs)
            if show:
                print(
                    f"\rzcrop.valid_windows: {p1}/{grid[0]} {names[0]}", end="", file=sys.stderr
                )
    if show:
        print(file=sys.stderr)
    all_runs = np.concatenate(runs) if runs else np.zeros((0, 2), dtype=np.uint64)
    if path is not None:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = f"{path}.{os.getpid()}.tmp.npz"
        np.savez_compressed(tmp, runs=all_runs)
        os.replace(tmp, path)
    return ValidMask(names, grid, [1] * len(grid), all_runs)
