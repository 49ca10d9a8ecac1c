"""Masks and weights over sample positions: ``valid=``, ``valid_times=`` and ``weights=`` of
:class:`zcrop.Loader` and :class:`zcrop.Samples`, turned into the cell grids the Rust sampler
takes.

A field never becomes an array with one entry per position unless it was given that way: a
numpy array keeps its own cells (fitted to the position grid by the sampler), a DataArray
becomes a rectilinear grid whose cells are the runs of positions nearest to each of its
labels, and a :class:`ValidMask` arrives as runs of allowed cells.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    from zcrop._loader import Source

__all__ = ["ValidMask"]

#: An edge beyond any position: a cell that covers a whole dimension.
_BEYOND = 2**63


class ValidMask:
    """A boolean mask over sample positions kept as runs of allowed cells, as
    :func:`zcrop.valid_windows` computes it: pass it as ``valid=``.

    ``shape`` is the grid in cells, ``cells`` per dimension either an int (cells of that many
    positions) or an array of edges (``shape[d] + 1`` non-decreasing positions), and ``runs``
    an ``(n, 2)`` uint64 array of C-order linear cell ranges ``[start, end)`` that are allowed.
    """

    __slots__ = ("cells", "dims", "runs", "shape")

    def __init__(
        self,
        dims: Sequence[str],
        shape: Sequence[int],
        cells: Sequence[Any],
        runs: np.ndarray[Any, Any],
    ) -> None:
        self.dims = [str(d) for d in dims]
        self.shape = [int(n) for n in shape]
        self.cells = [c if np.ndim(c) == 0 else np.asarray(c, dtype=np.uint64) for c in cells]
        self.runs = np.ascontiguousarray(np.asarray(runs, dtype=np.uint64).reshape(-1, 2))
        if not len(self.dims) == len(self.shape) == len(self.cells):
            raise ValueError("a ValidMask needs as many dims, shape entries and cells")

    @classmethod
    def from_bools(cls, dims: Sequence[str], allowed: np.ndarray[Any, Any]) -> ValidMask:
        """One cell per position: ``allowed`` over the position grid."""
        flat = np.ascontiguousarray(allowed, dtype=bool).ravel()
        return cls(dims, allowed.shape, [1] * allowed.ndim, _runs(flat))

    def count(self) -> int:
        """Number of allowed cells."""
        return int((self.runs[:, 1] - self.runs[:, 0]).sum()) if len(self.runs) else 0

    def to_numpy(self) -> np.ndarray[Any, Any]:
        """The mask as a boolean array of ``shape`` cells (materialised: for inspection)."""
        flat = np.zeros(int(np.prod(self.shape)), dtype=bool)
        for a, b in self.runs:
            flat[int(a) : int(b)] = True
        return flat.reshape(self.shape)

    def _spec(self, names: list[str]) -> dict[str, Any]:
        if self.dims != names:
            raise ValueError(
                f"this ValidMask is over positions {self.dims}, the loader's are {names}"
            )
        cells: tuple[Any, ...]
        if all(np.ndim(c) == 0 for c in self.cells):
            cells = ("size", [int(c) for c in self.cells])
        else:
            edges = [
                [i * int(c) for i in range(n + 1)] if np.ndim(c) == 0 else [int(x) for x in c]
                for n, c in zip(self.shape, self.cells)
            ]
            cells = ("edges", edges)
        return {"shape": self.shape, "cells": cells, "runs": self.runs}

    def __repr__(self) -> str:
        total = int(np.prod(self.shape))
        return (
            f"<ValidMask dims={self.dims} shape={tuple(self.shape)} "
            f"allowed={self.count()}/{total} cells in {len(self.runs)} runs>"
        )


def _runs(flat: np.ndarray[Any, Any]) -> np.ndarray[Any, Any]:
    """The ``[start, end)`` runs of ``True`` in a flat boolean array, as ``(n, 2)`` uint64
    (the Rust kernel, without the GIL)."""
    from zcrop import _zcrop

    runs: np.ndarray[Any, Any] = _zcrop.bool_runs(np.ascontiguousarray(flat, dtype=bool).ravel())
    return runs


def _is_dataarray(obj: Any) -> bool:
    return type(obj).__module__.startswith("xarray.") and hasattr(obj, "dims") and hasattr(
        obj, "coords"
    )


def _position_labels(
    srcs: list[Source], resolved: list[list[tuple[Any, ...]] | None], names: list[str]
) -> dict[str, np.ndarray[Any, Any]]:
    """Per position dimension, the coordinate label of every position of the grid, from the
    first xarray source that follows it (labels of its own axis mapped through scale and
    offset; ``resolved``: the sources' dims). Dimensions no xarray source follows are left
    out."""
    out: dict[str, np.ndarray[Any, Any]] = {}
    for src, dims in zip(srcs, resolved):
        if dims is None or src._dim_names is None:
            continue
        for axis, spec in enumerate(dims):
            if spec[0] != "along" or spec[1] in out or spec[1] not in names:
                continue
            labels = src._labels.get(src._dim_names[axis])
            if labels is None:
                continue
            _, pos, num, den, offset, _ = spec[:6]
            size = len(labels)
            grid = max(0, -(-(size - offset) * den // num))
            idx = np.arange(grid, dtype=np.int64) * num // den + offset
            out[pos] = labels[idx]
    return out


def _numbers(labels: np.ndarray[Any, Any], what: str) -> np.ndarray[Any, Any]:
    """Labels as comparable numbers: datetimes and timedeltas as int64 nanoseconds."""
    a = np.asarray(labels)
    if a.dtype.kind in "mM":
        return a.astype(f"{a.dtype.kind}8[ns]").astype(np.int64).astype(np.float64)
    if a.dtype.kind in "iuf":
        return a.astype(np.float64)
    raise TypeError(f"{what}: labels of dtype {a.dtype} cannot be matched to positions")


def _nearest_cells(
    mask_labels: np.ndarray[Any, Any],
    pos_labels: np.ndarray[Any, Any],
    dim: str,
    what: str,
) -> np.ndarray[Any, Any]:
    """For every position, the index of the nearest mask label; an error if a position lies
    more than half a mask spacing beyond the mask's first or last label."""
    if (np.asarray(mask_labels).dtype.kind in "mM") != (np.asarray(pos_labels).dtype.kind in "mM"):
        raise TypeError(f"{what}: its {dim!r} labels and the positions' are of different kinds")
    m = _numbers(mask_labels, what)
    p = _numbers(pos_labels, what)
    n = len(m)
    if n == 1:
        return np.zeros(len(p), dtype=np.int64)
    step = np.diff(m)
    if not ((step > 0).all() or (step < 0).all()):
        raise ValueError(f"{what}: its {dim!r} coordinate is not strictly monotonic")
    flip = step[0] < 0
    order = m[::-1] if flip else m
    j = np.clip(np.searchsorted(order, p), 1, n - 1)
    # Ties go to the larger label, as pandas' (and so xarray's) method="nearest" does.
    idx = np.where(p - order[j - 1] < order[j] - p, j - 1, j)
    lo = order[0] - (order[1] - order[0]) / 2
    hi = order[-1] + (order[-1] - order[-2]) / 2
    out = (p < lo) | (p > hi)
    if out.any():
        first = np.asarray(pos_labels)[np.flatnonzero(out)[0]]
        ends = np.asarray(mask_labels)[[0, -1]]
        raise ValueError(
            f"{what}: its {dim!r} coordinate ({ends[0]} .. {ends[1]}) does not cover the "
            f"positions' {dim!r} labels (e.g. {first}); {int(out.sum())} positions fall outside"
        )
    return (n - 1 - idx) if flip else idx


def _from_dataarray(
    da: Any,
    names: list[str],
    labels: dict[str, np.ndarray[Any, Any]],
    what: str,
) -> tuple[list[int], tuple[Any, ...], np.ndarray[Any, Any]]:
    """A DataArray over (some of) the position dimensions as a rectilinear grid over the
    positions: ``(shape, ("edges", edges), values)`` with values in C order."""
    extra = [d for d in da.dims if d not in names]
    if extra:
        raise ValueError(
            f"{what} has dimensions {extra} that are not position dimensions ({names})"
        )
    index: list[np.ndarray[Any, Any]] = []
    edges: list[list[int]] = []
    for d in names:
        if d not in da.dims:
            index.append(np.zeros(1, dtype=np.int64))
            edges.append([0, _BEYOND])
            continue
        if d not in labels:
            raise ValueError(
                f"{what} is a DataArray over {d!r}, but no xarray source follows position "
                f"dimension {d!r} to give its positions labels: pass a numpy array instead"
            )
        if d not in da.coords:
            raise ValueError(f"{what} has no {d!r} coordinate to match positions by")
        idx = _nearest_cells(np.asarray(da.coords[d].values), labels[d], d, what)
        starts = np.concatenate(([0], np.flatnonzero(np.diff(idx)) + 1))
        index.append(idx[starts])
        edges.append([int(x) for x in starts] + [len(idx)])
    values = np.asarray(da.transpose(*[d for d in names if d in da.dims]).values)
    values = values.reshape([da.sizes[d] if d in da.dims else 1 for d in names])
    values = values[np.ix_(*index)]
    return [len(e) - 1 for e in edges], ("edges", edges), values


def _grid_values(
    obj: Any, names: list[str], labels: dict[str, np.ndarray[Any, Any]], what: str
) -> tuple[list[int], tuple[Any, ...], np.ndarray[Any, Any]]:
    """A DataArray or numpy field over the positions: ``(shape, cells, values)``."""
    if _is_dataarray(obj):
        return _from_dataarray(obj, names, labels, what)
    values = np.asarray(obj)
    if values.ndim != len(names):
        raise ValueError(
            f"{what} has {values.ndim} dimensions; the positions {names} have {len(names)}"
        )
    return list(values.shape), ("fit",), values


def _as_mask(
    obj: Any, names: list[str], labels: dict[str, np.ndarray[Any, Any]], what: str
) -> dict[str, Any]:
    if isinstance(obj, ValidMask):
        return obj._spec(names)
    shape, cells, values = _grid_values(obj, names, labels, what)
    if values.dtype.kind not in "bui":
        raise TypeError(f"{what} must be boolean (or integer, non-zero allowed), not {values.dtype}")
    flat = np.ascontiguousarray(values != 0 if values.dtype != bool else values).ravel()
    return {"shape": [int(n) for n in shape], "cells": cells, "values": flat}


def _as_weights(
    obj: Any, names: list[str], labels: dict[str, np.ndarray[Any, Any]]
) -> dict[str, Any]:
    shape, cells, values = _grid_values(obj, names, labels, "weights")
    if values.dtype.kind not in "buif":
        raise TypeError(f"weights must be numbers, not {values.dtype}")
    flat = np.ascontiguousarray(values, dtype=np.float64).ravel()
    return {"shape": [int(n) for n in shape], "cells": cells, "values": flat}


def _times_mask(
    times: Any, names: list[str], labels: dict[str, np.ndarray[Any, Any]]
) -> dict[str, Any]:
    """``valid_times=``: a mask along the position dimension labelled by datetimes."""
    dims = [d for d in names if d in labels and np.asarray(labels[d]).dtype.kind == "M"]
    if len(dims) != 1:
        raise ValueError(
            "valid_times needs exactly one position dimension labelled by datetimes "
            f"(from an xarray source); found {dims or 'none'}"
        )
    (d,) = dims
    grid = np.asarray(labels[d])
    wanted = np.asarray(times, dtype=grid.dtype).ravel()
    if wanted.size == 0:
        raise ValueError(
            f"valid_times is empty, so it allows no position: give at least one {d!r} label "
            "of the positions (or leave valid_times out to allow them all)"
        )
    hit = np.isin(wanted, grid)
    if not hit.all():
        missing = wanted[~hit]
        raise ValueError(
            f"valid_times has {len(missing)} labels that are not {d!r} labels of the "
            f"positions, e.g. {[str(t) for t in missing[:3]]}"
        )
    allowed = np.isin(grid, wanted)
    shape = [len(grid) if n == d else 1 for n in names]
    edges = [
        list(range(len(grid) + 1)) if n == d else [0, _BEYOND] for n in names
    ]
    return {"shape": shape, "cells": ("edges", edges), "values": allowed}


def _fields(
    srcs: list[Source],
    names: list[str],
    valid: Any,
    valid_times: Any,
    weights: Any,
    labels: dict[str, np.ndarray[Any, Any]],
) -> tuple[list[dict[str, Any]], dict[str, Any] | None, dict[str, int]]:
    """The ``masks`` and ``weights`` entries of a loader spec over positions labelled by
    ``labels``, and the number of grid positions of each position dimension whose labels
    placed them (see :func:`check_grid`)."""
    masks = [
        _as_mask(v, names, labels, "valid" if len(_listed(valid)) == 1 else f"valid[{i}]")
        for i, v in enumerate(_listed(valid))
    ]
    if valid_times is not None:
        masks.append(_times_mask(valid_times, names, labels))
    weight_field = None if weights is None else _as_weights(weights, names, labels)
    used = {str(d) for v in [weights, *_listed(valid)] if _is_dataarray(v) for d in v.dims}
    if valid_times is not None:
        used |= {d for d, v in labels.items() if np.asarray(v).dtype.kind == "M"}
    return masks, weight_field, {d: len(labels[d]) for d in used if d in labels}


def _listed(valid: Any) -> list[Any]:
    """``valid=`` as a list of masks: one mask, or a list or tuple of them."""
    if valid is None:
        return []
    if isinstance(valid, (list, tuple)) and valid and all(
        isinstance(v, (np.ndarray, ValidMask)) or _is_dataarray(v) for v in valid
    ):
        return list(valid)
    return [valid]


def check_grid(grid: Sequence[int], names: list[str], labelled: dict[str, int]) -> None:
    """Fields placed by labels must have been placed on the grid the sampler uses (that of the
    first source following each position dimension)."""
    for d, g in zip(names, grid):
        if d in labelled and labelled[d] != int(g):
            raise ValueError(
                f"position dimension {d!r} has {int(g)} grid positions in the sampler but "
                f"{labelled[d]} labels from its first xarray source: list that source "
                "first among the sources"
            )
