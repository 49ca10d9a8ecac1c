"""The FFT of a Zarr array along an axis that spans many chunks, within a memory budget per
task, in this process or as tasks on Dask or Cubed.

``dask.array.fft`` and Cubed's FFT need the transformed axis in one chunk (dask #2620, cubed
#675); this one does not. It plans like the one-process FFT (whole lines in memory where they
fit, else the four-step algorithm through temporary Zarr arrays, see ``docs/python.md``) and,
with ``engine="dask"`` or ``engine="cubed"``, runs each pass as a set of independent tasks::

    from distributed import Client, LocalCluster
    import zcrop.fft

    client = Client(LocalCluster(n_workers=4, threads_per_worker=1, memory_limit="2GiB"))
    report = zcrop.fft.fft_along_axis(
        "era5.zarr/t2m", "time", "t2m_fft.zarr", memory_per_task="1GiB", engine="dask",
        client=client,
    )

Every task reads its block with zcrop, transforms it with the Rust kernels (the GIL released)
and writes whole chunks with zarrs, so a task that dies is simply run again; a job interrupted
altogether resumes where it stopped when called again with the same arguments.

The source, the target and the work directory may be object-store URLs, so that workers on many
machines share them::

    zcrop.fft.fft_along_axis(
        "s3://era5/t2m.zarr", "time", "s3://scratch/t2m_fft.zarr", engine="dask",
        storage_options={"region": "eu-west-1"}, source_storage_options={"anon": True},
    )
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from zcrop._api import Options, is_url, storage_option_pairs
from zcrop._zcrop import NativeFftJob, fft_local
from zcrop.errors import InvalidArgumentError

__all__ = ["FftReport", "fft_along_axis", "fft_dataset", "frequencies"]

#: Most tasks in one stage; larger arrays get larger tasks.
MAX_TASKS = 100_000
#: The least work per task (bytes of complex128 blocks) where a stage has enough of it.
MIN_TASK_BYTES = 32 << 20

_UNITS = {
    "": 1,
    "b": 1,
    "kb": 10**3,
    "mb": 10**6,
    "gb": 10**9,
    "tb": 10**12,
    "kib": 2**10,
    "mib": 2**20,
    "gib": 2**30,
    "tib": 2**40,
}


def _bytes(value: int | str, what: str) -> int:
    """Bytes from an int or a text such as ``"512MiB"`` or ``"2 GB"``."""
    if isinstance(value, bool):
        raise TypeError(f"{what} must be a number of bytes or a text like '1GiB'")
    if isinstance(value, int):
        n = value
    elif isinstance(value, str):
        m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", value)
        if m is None or m.group(2).lower() not in _UNITS:
            raise ValueError(f"{what}={value!r}: give bytes as e.g. 536870912, '512MiB' or '2GB'")
        n = int(float(m.group(1)) * _UNITS[m.group(2).lower()])
    else:
        raise TypeError(f"{what} must be a number of bytes or a text like '1GiB', not {value!r}")
    if n <= 0:
        raise ValueError(f"{what} must be positive, got {value!r}")
    return n


@dataclasses.dataclass(frozen=True)
class FftReport:
    """What :func:`fft_along_axis` did."""

    #: The output array's path.
    path: str
    #: ``"local"``, ``"dask"`` or ``"cubed"``.
    engine: str
    #: ``"in_memory"`` (whole lines per block) or ``"four_step"`` (through temporary arrays).
    strategy: str
    #: Per stage (``tiles``, or ``rechunk``, ``columns``, ``rows`` and maybe ``runs``): its name
    #: and task count (one task for the local engine, which runs the stages itself).
    stages: tuple[tuple[str, int], ...]
    #: Bytes of array data read: the input at its stored element size, temporaries as
    #: complex128.
    read_bytes: int
    #: Bytes of chunks written: the output and the temporaries.
    written_bytes: int
    #: The largest working block any task held, bytes.
    block_bytes: int
    #: Tasks skipped because an earlier, interrupted run of the same job had done them.
    resumed_tasks: int
    #: Wall time, seconds.
    seconds: float


@dataclasses.dataclass(frozen=True)
class _Input:
    """The array to transform: its path or URL, the options that open it, its dimension names
    and shape."""

    uri: str
    options: Options | None
    names: list[str | None] | None
    shape: tuple[int, ...]


def _xarray_input(da: Any) -> _Input:
    """The array under a variable of a dataset opened with ``engine="zcrop"``, and its
    dimensions; the FFT transforms stored values, so a variable xarray decodes is refused."""
    from zcrop._xarray import _source

    name = str(da.name) if da.name is not None else "data"
    backend, chain = _source(da.variable, name)
    if backend is None:
        raise TypeError(
            f"variable {name!r} is loaded in memory: pass the variable of a dataset opened "
            "with engine='zcrop' before .load()/.values"
        )
    if chain:
        raise InvalidArgumentError(
            f"variable {name!r} is decoded by xarray (scale, offset, fill values or times) "
            "but the FFT transforms the stored values: open the dataset with "
            "mask_and_scale=False, decode_times=False, or pass the array's path"
        )
    native = backend._array.native
    return _Input(
        native.uri,
        list(native.storage_options),
        [str(d) for d in da.dims],
        tuple(int(n) for n in da.shape),
    )


def _input(source: Any, explicit: Options | None, default: Options | None) -> _Input:
    """The array ``source`` names: a path or URL (opened with ``explicit``, else ``default``),
    a :class:`zcrop.Array` or an xarray variable opened with ``engine="zcrop"`` (their own
    options unless ``explicit``)."""
    from zcrop._api import open_array
    from zcrop._array import Array

    if isinstance(source, Array):
        found = _Input(source.native.uri, list(source.native.storage_options), None, ())
    elif isinstance(source, (str, os.PathLike)):
        found = _Input(os.fspath(source), default, None, ())
    elif hasattr(source, "variable") and hasattr(source, "dims"):
        found = _xarray_input(source)
    else:
        raise TypeError(
            "source must be a path, a URL, a zcrop.Array or a variable of a dataset opened with "
            f"engine='zcrop', not {type(source).__name__}"
        )
    options = explicit if explicit is not None else found.options
    found = dataclasses.replace(found, options=options if is_url(found.uri) else None)
    if found.shape:
        return found
    array = open_array(
        found.uri, storage_options=None if found.options is None else dict(found.options)
    )
    names = array.dimension_names
    return dataclasses.replace(
        found, names=None if names is None else list(names), shape=tuple(array.shape)
    )


def _location(where: str | os.PathLike[str]) -> str:
    """A URL as given (less a trailing ``/``), a path made absolute."""
    text = os.fspath(where)
    return text.rstrip("/") if is_url(text) else os.path.abspath(text)


def _axis(axis: int | str, names: list[str | None] | None, ndim: int) -> int:
    if isinstance(axis, str):
        if names is None or axis not in names:
            raise ValueError(f"no dimension named {axis!r} (the array's: {names})")
        return names.index(axis)
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"axis must be an int or a dimension name, not {axis!r}")
    if not -ndim <= axis < ndim:
        raise ValueError(f"axis {axis} of a {ndim}-d array")
    return axis % ndim


def fft_along_axis(
    source: Any,
    axis: int | str,
    target: str | os.PathLike[str],
    *,
    memory_per_task: int | str = "1GiB",
    engine: str = "local",
    client: Any = None,
    spec: Any = None,
    executor: Any = None,
    norm: str = "backward",
    dtype: str = "complex64",
    work_dir: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    task_bytes: int | str | None = None,
    progress: bool = False,
    storage_options: dict[str, Any] | None = None,
    source_storage_options: dict[str, Any] | None = None,
    axis_name: str | None = None,
) -> FftReport:
    """``numpy.fft.fft(source, axis=axis, norm=norm)`` written as a Zarr v3 array at ``target``,
    for arrays of any size: the axis may span many chunks and nothing need fit in memory.

    Parameters
    ----------
    source:
        The input array: a filesystem path (local, or shared by every worker) or an
        object-store URL (``s3://``, ``gs://``, ``az://``, ``https://``), a
        :class:`zcrop.Array`, or a variable of a dataset opened with ``engine="zcrop"`` (its
        stored values: a variable xarray decodes is refused). Any real or complex data type.
    axis:
        The axis to transform, by index or dimension name.
    target:
        Where the output goes (a path or an object-store URL): a new Zarr v3 array of the
        input's shape and dimension names, data type ``dtype``, with an attribute ``zcrop_fft``
        recording the axis and ``norm``.
    memory_per_task:
        Bytes one task may hold (blocks, chunk buffers, IO in flight), as an int or a text such
        as ``"512MiB"``; with ``engine="local"`` the whole transform's budget. A Dask worker runs
        one task per thread at once, so give workers ``threads * memory_per_task`` plus about
        200 MB for the worker itself. With ``engine="cubed"`` the default is what the spec's
        ``allowed_mem`` leaves after its ``reserved_mem``.
    engine:
        ``"local"``: this process. ``"dask"``: a graph of tasks on a ``dask.distributed``
        client (``client``, or the current one). ``"cubed"``: one Cubed operation per pass, run
        by ``executor`` under ``spec``.
    norm, dtype:
        numpy's ``norm=`` (``"backward"``, ``"ortho"``, ``"forward"``); the output type,
        ``"complex64"`` or ``"complex128"``.
    work_dir:
        Where the temporary arrays and the job's state go (a path or an object-store URL);
        every worker must reach it there. Default: beside the target (``<target>.zcrop-fft``),
        or for the local engine the system's temporary directory (it must be a local directory
        there). Removed when the transform completes.
    overwrite:
        Replace an existing target (only a Zarr array is ever deleted). Without it, an existing
        target is an error, except the target of the same unfinished job, which resumes.
    task_bytes:
        Work per task, as bytes of complex128 blocks (default: enough tasks per stage to keep
        every worker busy, at least 32 MiB each).
    progress:
        Show a progress bar: Dask's, or Cubed's (``pip install 'cubed[diagnostics]'``); the
        local engine shows none.
    storage_options:
        Options of the object store the target and ``work_dir`` URLs name (``endpoint_url``,
        ``region``, credentials, ...; see :func:`zcrop.open`), and of the source's unless
        ``source_storage_options`` is given. They travel with each task, never in the job's
        files; workers without them use the usual environment variables.
    source_storage_options:
        Options of the source's object store, when they differ (a public dataset read with
        ``{"anon": True}``, for example). Default: ``storage_options``, or those a
        :class:`zcrop.Array` or xarray variable was opened with.
    axis_name:
        The target's name for the transformed dimension (``"freq_time"``, say); default: the
        source's.

    Raises
    ------
    InvalidArgumentError
        A budget too small for one block, an axis length with no split that fits it (a large
        prime, for example: the message says what budget would do), an existing target, or a
        worker that cannot reach the input, the target or ``work_dir``: all before any task is
        submitted.
    """
    if engine not in ("local", "dask", "cubed"):
        raise ValueError(f"engine must be 'local', 'dask' or 'cubed', not {engine!r}")
    if engine != "dask" and client is not None:
        raise ValueError("client= is for engine='dask'")
    if engine != "cubed" and (spec is not None or executor is not None):
        raise ValueError("spec= and executor= are for engine='cubed'")
    options = storage_option_pairs(storage_options)
    explicit = storage_option_pairs(source_storage_options)
    src = _input(source, explicit, options)
    shape = src.shape
    ax = _axis(axis, src.names, len(shape))
    target = _location(target)
    if engine == "cubed" and memory_per_task == "1GiB":
        memory = _cubed_task_memory(_cubed_spec(spec))
    else:
        memory = _bytes(memory_per_task, "memory_per_task")
    t0 = time.perf_counter()
    if engine == "local":
        if work_dir is not None and is_url(os.fspath(work_dir)):
            raise InvalidArgumentError(
                "engine='local' keeps its temporaries in a local directory; work_dir="
                f"{os.fspath(work_dir)!r} is a URL (use engine='dask' to share them)"
            )
        r = fft_local(
            src.uri,
            target,
            ax,
            memory,
            norm,
            dtype,
            temp_dir=None if work_dir is None else os.fspath(work_dir),
            overwrite=overwrite,
            storage_options=options,
            input_storage_options=src.options,
            axis_name=axis_name,
        )
        return FftReport(
            path=target,
            engine="local",
            strategy=r["strategy"],
            stages=((r["strategy"], 1),),
            read_bytes=r["read_bytes"],
            written_bytes=r["output_bytes"] + r["temp_bytes"],
            block_bytes=r["block_bytes"],
            resumed_tasks=0,
            seconds=time.perf_counter() - t0,
        )
    work = _location(work_dir) if work_dir is not None else f"{target}.zcrop-fft"
    if engine == "dask":
        client = _dask_client(client)
        slots = max(1, sum(client.nthreads().values()))
    else:
        slots = os.cpu_count() or 1
    # Bytes of the whole input as complex128.
    work_bytes = 16 * math.prod(shape)
    per_task = (
        max(MIN_TASK_BYTES, work_bytes // (4 * slots))
        if task_bytes is None
        else _bytes(task_bytes, "task_bytes")
    )
    job, _done_before = NativeFftJob.create(
        src.uri,
        target,
        ax,
        memory,
        norm,
        dtype,
        work,
        per_task,
        MAX_TASKS,
        overwrite,
        storage_options=options,
        input_storage_options=src.options,
        axis_name=axis_name,
    )
    stages = job.stages()
    task = _Task(job.to_json(), _frozen(options), _frozen(src.options))
    if engine == "dask":
        reports = _run_dask(job, task, stages, client, progress)
    else:
        reports = _run_cubed(task, stages, memory, _cubed_spec(spec), executor, progress)
    job.finish()
    return FftReport(
        path=target,
        engine=engine,
        strategy=job.strategy,
        stages=tuple((s["name"], s["tasks"]) for s in stages),
        read_bytes=sum(r["read_bytes"] for r in reports),
        written_bytes=sum(r["written_bytes"] for r in reports),
        block_bytes=max((r["block_bytes"] for r in reports), default=0),
        resumed_tasks=sum(r["skipped"] for r in reports),
        seconds=time.perf_counter() - t0,
    )


# --- Dataset in, Dataset out ---------------------------------------------------------------------

#: Seconds per unit of CF time units (``"hours since 2000-01-01"``).
_CF_SECONDS = {
    "nanoseconds": 1e-9,
    "microseconds": 1e-6,
    "milliseconds": 1e-3,
    "seconds": 1.0,
    "minutes": 60.0,
    "hours": 3600.0,
    "days": 86400.0,
}


def frequencies(coord: Any, n: int) -> tuple[np.ndarray[Any, Any], dict[str, Any]]:
    """``numpy.fft.fftfreq`` for ``n`` samples spaced as the labels of ``coord`` (``None``: one
    per sample), and the attributes of the frequency coordinate. Times (datetime64,
    timedelta64, or numbers in CF units such as ``"hours since 2000-01-01"``) give cycles per
    second; other numbers cycles per their unit. Labels must be evenly spaced."""
    if coord is None:
        return np.fft.fftfreq(n), {"long_name": "frequency", "units": "cycles per sample"}
    values = np.asarray(coord.values)
    name = coord.name
    if values.size < 2:
        raise InvalidArgumentError(f"one label along {name!r}: no spacing to take frequencies from")
    units = str(coord.attrs.get("units", ""))
    if values.dtype.kind in "mM":
        steps = np.diff(values).astype("timedelta64[ns]").astype(np.int64).astype(np.float64) * 1e-9
        unit = "s-1"
    else:
        steps = np.diff(values.astype(np.float64))
        word = units.split(" since ")[0].strip().lower() if " since " in units else ""
        if word in _CF_SECONDS:
            steps = steps * _CF_SECONDS[word]
            unit = "s-1"
        else:
            unit = f"1/({units})" if units else "cycles per unit"
    d = float(steps[0])
    if d == 0 or not np.allclose(steps, d, rtol=1e-9, atol=0):
        raise InvalidArgumentError(
            f"the FFT's frequencies need evenly spaced labels along {name!r}; the spacings "
            f"run from {steps.min()} to {steps.max()}"
            + (" seconds" if unit == "s-1" else "")
        )
    return np.fft.fftfreq(n, d), {"long_name": "frequency", "units": unit, "spacing": d}


def _existing(target: str, options: dict[str, str] | None) -> str:
    """What is at ``target``: ``"absent"`` (nothing, or an empty directory), ``"group"`` (a
    Zarr group) or ``"other"``."""
    from zcrop._api import open as zopen
    from zcrop._group import Group
    from zcrop.errors import NodeNotFoundError

    if not is_url(target) and (
        not os.path.exists(target) or (os.path.isdir(target) and not os.listdir(target))
    ):
        return "absent"
    try:
        node = zopen(target, storage_options=options)
    except NodeNotFoundError:
        return "absent" if is_url(target) else "other"
    return "group" if isinstance(node, Group) else "other"


def fft_dataset(
    ds: Any,
    dim: str,
    target: str | os.PathLike[str],
    *,
    variables: list[str] | None = None,
    work_dir: str | os.PathLike[str] | None = None,
    overwrite: bool = False,
    storage_options: dict[str, Any] | None = None,
    **kwargs: Any,
) -> Any:
    """The FFT along dimension ``dim`` of the variables of an xarray Dataset opened with
    ``engine="zcrop"``, written as a Zarr v3 group at ``target`` and returned as a Dataset
    (opened lazily with ``engine="zcrop"``).

    Every variable named in ``variables`` (default: every data variable along ``dim``) goes
    through :func:`fft_along_axis` (its stored values: open the dataset with
    ``mask_and_scale=False`` where xarray would decode them). In the result, dimension ``dim``
    becomes ``freq_<dim>``, whose coordinate is ``numpy.fft.fftfreq`` of the spacing of
    ``dim``'s labels (cycles per second for times, see :func:`frequencies`); the other
    coordinates that do not run along ``dim``, and the dataset's attributes, are kept.
    ``kwargs`` go to :func:`fft_along_axis` (``memory_per_task``, ``engine``, ``client``,
    ``norm``, ``dtype``, ...); a ``work_dir`` gets one subdirectory per variable.

    The group's coordinates are written with xarray's ``to_zarr`` (for a URL target that needs
    zarr-python's fsspec store for it, e.g. s3fs); an existing target is replaced only with
    ``overwrite=True`` and only if it is a Zarr group.
    """
    import xarray as xr

    if isinstance(ds, xr.DataArray):
        ds = ds.to_dataset(name=ds.name if ds.name is not None else "data")
    if not isinstance(ds, xr.Dataset):
        raise TypeError(f"ds must be an xarray Dataset or DataArray, not {type(ds).__name__}")
    if dim not in ds.dims:
        raise ValueError(f"no dimension {dim!r} in the dataset (its: {list(ds.dims)})")
    names = (
        [str(v) for v in ds.data_vars if dim in ds[v].dims] if variables is None else variables
    )
    missing = [v for v in names if v not in ds.data_vars or dim not in ds[v].dims]
    if missing or not names:
        raise ValueError(
            f"no data variable along {dim!r} to transform"
            if not names
            else f"not data variables along {dim!r}: {missing}"
        )
    freq_dim = f"freq_{dim}"
    freq, attrs = frequencies(ds[dim] if dim in ds.coords else None, int(ds.sizes[dim]))
    target = _location(target)
    options = storage_option_pairs(storage_options) if is_url(target) else None
    # The target's store options (a local target has none; they may still serve the source).
    opts = None if options is None else dict(options)
    found = _existing(target, opts)
    if found != "absent":
        if not overwrite:
            raise InvalidArgumentError(
                f"the target {target} exists; pass overwrite=True to replace it"
            )
        if found != "group":
            raise InvalidArgumentError(
                f"the target {target} exists and is not a Zarr group; it is not removed even "
                "with overwrite=True"
            )
    coords = {
        str(k): v.variable
        for k, v in ds.coords.items()
        if dim not in v.dims and str(k) != dim
    }
    coords[freq_dim] = xr.Variable((freq_dim,), freq, attrs)
    skeleton = xr.Dataset(coords=coords, attrs=dict(ds.attrs))
    skeleton.attrs["zcrop_fft"] = {"dim": dim, "variables": names}
    skeleton.to_zarr(
        target,
        mode="w" if found == "group" else "w-",
        zarr_format=3,
        consolidated=False,
        storage_options=opts,
    )
    for name in names:
        fft_along_axis(
            ds[name],
            dim,
            f"{target}/{name}",
            work_dir=None if work_dir is None else f"{os.fspath(work_dir)}/{name}",
            storage_options=storage_options,
            axis_name=freq_dim,
            **kwargs,
        )
    return xr.open_dataset(target, engine="zcrop", storage_options=opts)


# --- the tasks, as the workers run them ----------------------------------------------------------

#: Storage options as a hashable tuple of pairs.
_Frozen = tuple[tuple[str, str], ...] | None


def _frozen(options: Options | None) -> _Frozen:
    return None if options is None else tuple(options)


@dataclasses.dataclass(frozen=True)
class _Task:
    """What every task carries: the job's description and the storage options its worker opens
    the job's URLs with (the target's and work directory's, the source's)."""

    job_json: str
    options: _Frozen
    input_options: _Frozen

    def job(self) -> NativeFftJob:
        """The job, opened once per worker process."""
        cached = _JOBS.get(self)
        if cached is None:
            if len(_JOBS) > 8:
                _JOBS.clear()
            cached = _JOBS[self] = NativeFftJob.from_json(
                self.job_json,
                None if self.options is None else list(self.options),
                None if self.input_options is None else list(self.input_options),
            )
        return cached


_JOBS: dict[_Task, NativeFftJob] = {}


def _run_task(task: _Task, stage: int, index: int, *_after: Any) -> dict[str, Any]:
    """Runs one task (``_after``: the previous stage's summary, only there to order tasks)."""
    return dict(task.job().run_task(stage, index))


def _summary(reports: list[dict[str, Any]]) -> dict[str, Any]:
    """One stage's reports, summed (what the next stage waits for); ``skipped`` counts the
    tasks an earlier run had done."""
    return {
        "tasks": len(reports),
        "read_bytes": sum(r["read_bytes"] for r in reports),
        "written_bytes": sum(r["written_bytes"] for r in reports),
        "block_bytes": max((r["block_bytes"] for r in reports), default=0),
        "skipped": sum(1 for r in reports if r["skipped"]),
    }


def _check_access(task: _Task) -> str | None:
    """On a worker: ``None``, or why the job's storage is out of its reach."""
    try:
        task.job().check_access()
    except Exception as e:  # noqa: BLE001 - reported back to the submitting process
        return f"{type(e).__name__}: {e}"
    return None


# --- Dask ----------------------------------------------------------------------------------------


def _dask_client(client: Any) -> Any:
    try:
        import distributed
    except ImportError as e:
        raise ImportError("engine='dask' needs dask.distributed: pip install distributed") from e
    if client is None:
        try:
            client = distributed.get_client()
        except ValueError as e:
            raise ValueError(
                "engine='dask' needs a dask.distributed Client: pass client= or create one"
            ) from e
    return client


def _run_dask(
    job: NativeFftJob, task: _Task, stages: list[dict[str, Any]], client: Any, progress: bool
) -> list[dict[str, Any]]:
    """Checks every worker's access, then runs the stages as one graph: each stage's tasks
    depend on a summary of the stage before."""
    import distributed

    problems = {w: p for w, p in client.run(_check_access, task).items() if p is not None}
    if problems:
        lines = "\n".join(f"  {w}: {p}" for w, p in sorted(problems.items()))
        raise InvalidArgumentError(
            f"{len(problems)} worker(s) cannot reach the job's storage (input, target "
            f"{job.output}, work directory {job.work_dir}):\n{lines}"
        )
    token = os.urandom(4).hex()
    graph: dict[Any, Any] = {}
    after: tuple[Any, ...] = ()
    summaries = []
    for s, info in enumerate(stages):
        name = f"zcrop-fft-{info['name']}-{token}"
        keys = [(name, t) for t in range(info["tasks"])]
        for key in keys:
            graph[key] = (_run_task, task, s, key[1], *after)
        done = f"zcrop-fft-{info['name']}-done-{token}"
        graph[done] = (_summary, keys)
        summaries.append(done)
        after = (done,)
    futures = client.get(graph, summaries, sync=False)
    if progress:
        distributed.progress(futures, notebook=False)  # type: ignore[no-untyped-call]
    return list(client.gather(futures))


# --- Cubed ---------------------------------------------------------------------------------------


def _cubed_spec(spec: Any) -> Any:
    try:
        import cubed  # type: ignore[import-untyped]
    except ImportError as e:
        raise ImportError("engine='cubed' needs Cubed: pip install cubed") from e
    return spec if spec is not None else cubed.Spec()


#: What a Cubed task holds besides the FFT's budget (its Python objects, the task record).
_CUBED_OVERHEAD = 16 << 20


def _cubed_task_memory(spec: Any) -> int:
    """The FFT budget per task that Cubed's ``allowed_mem`` leaves."""
    allowed, reserved = int(spec.allowed_mem), int(spec.reserved_mem or 0)
    left = allowed - reserved - _CUBED_OVERHEAD
    if left <= 0:
        raise InvalidArgumentError(
            f"Cubed's allowed_mem ({allowed} bytes) leaves nothing for the FFT after "
            f"reserved_mem ({reserved}) and the task's own {_CUBED_OVERHEAD} bytes"
        )
    return left


def _run_cubed(
    task: _Task,
    stages: list[dict[str, Any]],
    memory: int,
    spec: Any,
    executor: Any,
    progress: bool,
) -> list[dict[str, Any]]:
    """One Cubed operation per stage: an array of one block per task, each block the task's
    report; a stage reads the first block of the stage before, which orders the stages. Cubed
    checks each task's projected memory (``memory`` plus its own) against ``allowed_mem``."""
    import cubed

    problem = _check_access(task)
    if problem is not None:
        raise InvalidArgumentError(f"the job's storage is out of reach: {problem}")
    fields = ("read_bytes", "written_bytes", "block_bytes", "skipped")

    def block(stage: int) -> Callable[..., Any]:
        def run(*_inputs: Any, block_id: tuple[int, ...] = (0,), **_kw: Any) -> Any:
            # Cubed passes the (ignored) input blocks first.
            r = _run_task(task, stage, block_id[0])
            return np.array([[int(r[f]) for f in fields]], dtype=np.int64)

        return run

    prev = None
    arrays = []
    for s, info in enumerate(stages):
        n = int(info["tasks"])
        if prev is None:
            x = cubed.map_blocks(
                block(s),
                cubed.empty((n, len(fields)), dtype=np.int64, chunks=(1, len(fields)), spec=spec),
                dtype=np.int64,
                chunks=(1, len(fields)),
                extra_projected_mem=memory,
            )
        else:
            x = cubed.core.ops.map_selection(
                block(s),
                lambda key: (slice(0, 1), slice(None)),
                prev,
                shape=(n, len(fields)),
                dtype=np.int64,
                chunks=((1,) * n, (len(fields),)),
                max_num_input_blocks=1,
                extra_projected_mem=memory,
            )
        arrays.append(x)
        prev = x
    callbacks = []
    if progress:
        try:
            from cubed.diagnostics.tqdm import TqdmProgressBar  # type: ignore[import-untyped]
        except ImportError as e:
            raise ImportError(
                "progress=True with engine='cubed' needs Cubed's progress bars: "
                "pip install 'cubed[diagnostics]'"
            ) from e
        callbacks.append(TqdmProgressBar())
    results = cubed.compute(*arrays, executor=executor, callbacks=callbacks, optimize_graph=False)
    out = []
    for r in results:
        for row in np.asarray(r):
            out.append(dict(zip(fields, (int(v) for v in row))))
    return out
