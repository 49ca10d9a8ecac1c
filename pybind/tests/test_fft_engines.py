"""zcrop.fft.fft_along_axis on real schedulers: in this process, as a dask.distributed graph on
a LocalCluster of worker processes, and as Cubed operations on Cubed's executors.

Checked: results equal numpy.fft for both plans (whole lines, four-step) and every engine; an
array eight times larger than all workers' memory limits together completes with no worker
over its limit; a worker killed mid-run, and a job interrupted and started again, still give
the one-process result bit for bit; bad input fails before any task is submitted; source,
target and work directory on an S3 server (moto on loopback) give the same results.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import zcrop
import zcrop.fft
from zcrop._zcrop import NativeFftJob

zarr = pytest.importorskip("zarr")
dask = pytest.importorskip("dask")
distributed = pytest.importorskip("distributed")
cubed = pytest.importorskip("cubed")

#: A budget too small for whole lines of the arrays below: the four-step plan.
SMALL = 300 << 10


def write(path: Path, x: np.ndarray, chunks: tuple[int, ...], dims: tuple[str, ...]) -> str:
    a = zarr.create_array(
        str(path), shape=x.shape, chunks=chunks, dtype=x.dtype, dimension_names=dims
    )
    a[:] = x
    return str(path)


def read(path: str | Path) -> np.ndarray:
    return np.asarray(zarr.open_array(str(path), mode="r")[:])


def close(got: np.ndarray, want: np.ndarray, rel: float) -> None:
    err = np.abs(got.astype(np.complex128) - want).max() / max(np.abs(want).max(), 1.0)
    assert err <= rel, err


@pytest.fixture(scope="module")
def client():
    """Two single-threaded worker processes."""
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        yield c


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> tuple[str, np.ndarray]:
    root = tmp_path_factory.mktemp("fft-in")
    x = np.random.default_rng(3).standard_normal((6, 3000, 5)).astype("f4")
    return write(root / "in.zarr", x, (4, 100, 3), ("y", "time", "c")), x


def run(engine: str, client, *args, **kwargs) -> zcrop.fft.FftReport:
    if engine == "dask":
        kwargs["client"] = client
    if engine == "cubed" and "spec" not in kwargs:
        work = Path(str(args[2]) + ".cubed")
        kwargs.setdefault("spec", cubed.Spec(work_dir=str(work), allowed_mem="500MB"))
    return zcrop.fft.fft_along_axis(*args, engine=engine, **kwargs)


@pytest.mark.parametrize("engine", ["local", "dask", "cubed"])
@pytest.mark.parametrize("budget", [8 << 20, SMALL], ids=["in_memory", "four_step"])
def test_engines_match_numpy(engine, budget, data, client, tmp_path):
    path, x = data
    out = tmp_path / "out.zarr"
    r = run(engine, client, path, "time", out, memory_per_task=budget, task_bytes=1 << 20)
    want = np.fft.fft(x.astype("f8"), axis=1)
    close(read(out), want, 2e-6)
    assert r.strategy == ("in_memory" if budget > SMALL else "four_step")
    assert r.engine == engine
    if engine != "local":
        names = [s for s, _ in r.stages]
        assert names == (["tiles"] if budget > SMALL else ["rechunk", "columns", "rows", "runs"])
        assert all(n >= 1 for _, n in r.stages)
        # The work directory is gone.
        assert not Path(f"{out}.zcrop-fft").exists()
    written = zarr.open_array(str(out), mode="r")
    assert written.attrs["zcrop_fft"]["axis"] == 1
    assert written.attrs["zcrop_fft"]["norm"] == "backward"
    assert written.metadata.dimension_names == ("y", "time", "c")


@pytest.mark.parametrize("engine", ["local", "dask", "cubed"])
def test_norms_and_types(engine, data, client, tmp_path):
    path, x = data
    out = tmp_path / "o.zarr"
    run(
        engine, client, zcrop.open(path), 0, out, memory_per_task=SMALL, norm="ortho",
        dtype="complex128", task_bytes=1 << 20,
    )
    got = read(out)
    assert got.dtype == np.complex128
    close(got, np.fft.fft(x.astype("f8"), axis=0, norm="ortho"), 1e-12)


def test_the_same_plan_moves_the_same_bytes(data, client, tmp_path):
    """Task engines read and write what the one-process transform does."""
    path, _ = data
    reports = {
        e: run(e, client, path, 1, tmp_path / f"{e}.zarr", memory_per_task=SMALL, task_bytes=1)
        for e in ("local", "dask", "cubed")
    }
    local = reports["local"]
    for e in ("dask", "cubed"):
        assert reports[e].read_bytes == local.read_bytes, e
        assert reports[e].written_bytes == local.written_bytes, e
    assert (read(tmp_path / "dask.zarr") == read(tmp_path / "local.zarr")).all()


def test_cubed_processes_executor(data, tmp_path):
    """Cubed's multi-process executor."""
    from cubed.runtime.executors.local import ProcessesExecutor

    path, x = data
    out = tmp_path / "o.zarr"
    zcrop.fft.fft_along_axis(
        path, 1, out, engine="cubed", executor=ProcessesExecutor(max_workers=2),
        spec=cubed.Spec(work_dir=str(tmp_path / "cubed"), allowed_mem="500MB"),
        memory_per_task=SMALL, task_bytes=1 << 20,
    )
    close(read(out), np.fft.fft(x.astype("f8"), axis=1), 2e-6)


def test_cubed_dask_executor(data, client, tmp_path):
    """Cubed's Dask executor on the worker processes of a dask.distributed cluster (Cubed 0.27
    needs distributed 2026.6 or older: from 2026.7 an asynchronous client's
    ``scheduler_info()`` lists no workers, and Cubed's memory check refuses to start)."""
    from cubed.runtime.executors.dask import DaskExecutor

    path, x = data
    out = tmp_path / "o.zarr"
    report = zcrop.fft.fft_along_axis(
        path, 1, out, engine="cubed",
        executor=DaskExecutor(compute_kwargs={"address": client.scheduler.address}),
        spec=cubed.Spec(work_dir=str(tmp_path / "cubed"), allowed_mem="500MB"),
        memory_per_task=SMALL, task_bytes=1 << 20,
    )
    assert [n for n, _ in report.stages][:3] == ["rechunk", "columns", "rows"]
    close(read(out), np.fft.fft(x.astype("f8"), axis=1), 2e-6)


def test_cubed_checks_the_task_budget_against_allowed_mem(data, tmp_path):
    path, _ = data
    spec = cubed.Spec(work_dir=str(tmp_path / "c"), allowed_mem="100MB")
    with pytest.raises(ValueError, match="allowed"):
        zcrop.fft.fft_along_axis(
            path, 1, tmp_path / "o.zarr", engine="cubed", spec=spec, memory_per_task="200MB"
        )
    # By default the task budget is what allowed_mem leaves.
    r = zcrop.fft.fft_along_axis(path, 1, tmp_path / "o2.zarr", engine="cubed", spec=spec)
    assert r.strategy == "in_memory"


def _hwm() -> int:
    """This process's peak resident set, bytes."""
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmHWM")


def test_an_array_eight_times_all_workers_memory(tmp_path):
    """3 GiB of float64 through two workers limited to 192 MiB each: every worker's peak
    resident set stays under its limit (the nanny would kill it at 95%), none restarts, and
    spot-checked lines equal numpy's."""
    limit = 192 << 20
    lines, n = 24576, 16384
    assert lines * n * 8 >= 8 * 2 * limit
    # 3 GiB in and 3 GiB out, deleted at the end whatever happens: say so before filling the
    # disk halfway, which would fail the tests after this one for no reason of their own.
    need, free = 2 * lines * n * 8 + (1 << 30), shutil.disk_usage(tmp_path).free
    assert free >= need, f"needs {need / 2**30:.1f} GiB free in {tmp_path}, has {free / 2**30:.1f}"
    try:
        _eight_times_memory(tmp_path, limit, lines, n)
    finally:
        shutil.rmtree(tmp_path, ignore_errors=True)


def _eight_times_memory(tmp_path: Path, limit: int, lines: int, n: int) -> None:
    a = zarr.create_array(
        str(tmp_path / "big.zarr"), shape=(lines, n), chunks=(64, 2048), dtype="f8",
        dimension_names=("x", "time"), compressors=None,
    )
    rng = np.random.default_rng(5)
    picks = [0, 4097, lines - 1]
    kept = {}
    for i in range(0, lines, 512):
        block = rng.standard_normal((512, n))
        a[i : i + 512] = block
        for p in picks:
            if i <= p < i + 512:
                kept[p] = block[p - i].copy()
    with (
        # A paused worker would wait for memory that the allocator keeps: measure, not pause.
        dask.config.set({"distributed.worker.memory.pause": False}),
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, memory_limit=limit, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        pids = c.run(os.getpid)
        r = zcrop.fft.fft_along_axis(
            str(tmp_path / "big.zarr"), "time", tmp_path / "out.zarr", engine="dask",
            client=c, memory_per_task="32MiB",
        )
        peaks = c.run(_hwm)
        assert c.run(os.getpid) == pids, "a worker was restarted"
    print(f"\n{r}\nworker peaks (MiB): {[p / 2**20 for p in peaks.values()]}")
    assert all(p < limit for p in peaks.values()), peaks
    out = zarr.open_array(str(tmp_path / "out.zarr"), mode="r")
    for p in picks:
        close(out[p], np.fft.fft(kept[p]), 2e-6)


def test_a_killed_worker_changes_nothing(tmp_path):
    x = np.random.default_rng(9).standard_normal((2048, 8192))
    path = write(tmp_path / "in.zarr", x, (64, 1024), ("x", "time"))
    zcrop.fft.fft_along_axis(path, 1, tmp_path / "local.zarr", memory_per_task="16MiB")
    with (
        distributed.LocalCluster(
            n_workers=2, threads_per_worker=1, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as c,
    ):
        out = tmp_path / "out.zarr"
        done = Path(f"{out}.zcrop-fft") / "done" / "0"
        result: dict = {}

        def go():
            try:
                result["report"] = zcrop.fft.fft_along_axis(
                    path, 1, out, engine="dask", client=c, memory_per_task="16MiB",
                    task_bytes=1 << 20,
                )
            except BaseException as e:  # noqa: BLE001 - re-raised below
                result["error"] = e

        t = threading.Thread(target=go)
        t.start()
        deadline = time.monotonic() + 60
        while not (done.is_dir() and len(os.listdir(done)) >= 2):
            assert time.monotonic() < deadline, "no task finished"
            time.sleep(0.005)
        killed = next(iter(c.run(os.getpid).values()))
        finished_before = len(os.listdir(done))
        os.kill(killed, signal.SIGKILL)
        t.join(120)
        assert not t.is_alive()
        assert "error" not in result, result.get("error")
    report = result["report"]
    assert finished_before < report.stages[0][1], "the job ended before the kill"
    assert (read(out) == read(tmp_path / "local.zarr")).all()


def test_an_interrupted_job_resumes(data, client, tmp_path):
    path, _ = data
    out = tmp_path / "out.zarr"
    work = Path(f"{out}.zcrop-fft")
    task_bytes = 1 << 20
    # What fft_along_axis creates for these arguments; half its tasks run, then "a crash".
    job, done = NativeFftJob.create(
        path, str(out), 1, SMALL, "backward", "complex64", str(work), task_bytes,
        zcrop.fft.MAX_TASKS, False,
    )
    assert done is None
    stages = job.stages()
    for t in range(stages[0]["tasks"]):
        job.run_task(0, t)
    job.run_task(1, 0)
    # Another transform cannot take over the unfinished job's work directory.
    with pytest.raises(zcrop.InvalidArgumentError, match="another transform"):
        zcrop.fft.fft_along_axis(
            path, 1, tmp_path / "x.zarr", work_dir=work, engine="dask", client=client,
            memory_per_task=SMALL,
        )
    r = zcrop.fft.fft_along_axis(
        path, 1, out, engine="dask", client=client, memory_per_task=SMALL, task_bytes=task_bytes
    )
    assert r.resumed_tasks == stages[0]["tasks"] + 1
    zcrop.fft.fft_along_axis(path, 1, tmp_path / "local.zarr", memory_per_task=SMALL)
    assert (read(out) == read(tmp_path / "local.zarr")).all()


@pytest.mark.parametrize("engine", ["local", "dask", "cubed"])
def test_bad_input_fails_before_any_task(engine, client, tmp_path):
    prime = 100_003
    path = write(tmp_path / "p.zarr", np.zeros(prime, "f4"), (1000,), ("t",))
    out = tmp_path / "o.zarr"
    with pytest.raises(zcrop.InvalidArgumentError, match="cannot be split") as e:
        run(engine, client, path, 0, out, memory_per_task=SMALL)
    assert "budget of about" in str(e.value)
    assert not Path(f"{out}.zcrop-fft").exists() and not out.exists()
    # An existing target is refused unless overwrite=True, which replaces only Zarr arrays.
    ok = write(tmp_path / "ok.zarr", np.ones(64, "f4"), (16,), ("t",))
    run(engine, client, ok, 0, out)
    with pytest.raises(zcrop.InvalidArgumentError, match="exists"):
        run(engine, client, ok, 0, out)
    run(engine, client, ok, 0, out, overwrite=True)
    close(read(out), np.fft.fft(np.ones(64)), 1e-6)
    keep = tmp_path / "notes"
    keep.mkdir()
    (keep / "a.txt").write_text("keep")
    with pytest.raises(zcrop.InvalidArgumentError, match="not a Zarr array"):
        run(engine, client, ok, 0, keep, overwrite=True)
    assert (keep / "a.txt").exists()
    with pytest.raises(ValueError, match="no dimension"):
        run(engine, client, ok, "lat", tmp_path / "o2.zarr")
    with pytest.raises(ValueError, match="memory_per_task"):
        run(engine, client, ok, 0, tmp_path / "o3.zarr", memory_per_task="lots")


def _can_unshare() -> bool:
    if not shutil.which("unshare") or sys.platform != "linux":
        return False
    return subprocess.run(["unshare", "--mount", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _can_unshare(), reason="needs unshare(1) with mount namespaces (root)")
def test_a_worker_that_cannot_see_the_storage_is_named_before_submission(tmp_path):
    """A third worker runs in a mount namespace where the test's directory is an empty tmpfs:
    the job is refused, naming it, and no task ran."""
    x = np.arange(4096, dtype="f4").reshape(4, 1024)
    path = write(tmp_path / "in.zarr", x, (2, 256), ("x", "t"))
    with (
        distributed.LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None)
        as cluster,
        distributed.Client(cluster) as c,
    ):
        hidden = subprocess.Popen(
            [
                "unshare", "--mount", "--propagation", "private", "sh", "-c",
                f'mount -t tmpfs none "{tmp_path}" && exec "{sys.executable}" -m '
                f"distributed.cli.dask_worker {cluster.scheduler_address} --nthreads 1 "
                "--no-nanny --no-dashboard",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            c.wait_for_workers(2, timeout=60)
            out = tmp_path / "o.zarr"
            with pytest.raises(zcrop.InvalidArgumentError, match="1 worker") as e:
                zcrop.fft.fft_along_axis(path, 1, out, engine="dask", client=c)
            assert "job description" in str(e.value)
            done = Path(f"{out}.zcrop-fft") / "done" / "0"
            assert os.listdir(done) == []
        finally:
            hidden.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                hidden.wait(30)
            hidden.kill()


def test_dask_progress_bar(data, client, tmp_path, capsys):
    path, _ = data
    zcrop.fft.fft_along_axis(
        path, 1, tmp_path / "o.zarr", engine="dask", client=client, progress=True,
        memory_per_task=SMALL,
    )
    assert "Completed" in capsys.readouterr().out


def test_an_xarray_variable_as_source(tmp_path):
    xr = pytest.importorskip("xarray")
    x = np.random.default_rng(1).standard_normal((200, 3, 4)).astype("f4")
    ds = xr.Dataset({"t2m": (("time", "lat", "lon"), x), "packed": (("time", "lat"), x[:, :, 0])})
    ds.to_zarr(
        tmp_path / "ds.zarr",
        encoding={"t2m": {"chunks": (16, 3, 4), "_FillValue": None},
                  "packed": {"scale_factor": 0.5, "dtype": "i2", "_FillValue": None}},
        consolidated=False, zarr_format=3,
    )
    opened = xr.open_dataset(tmp_path / "ds.zarr", engine="zcrop")
    zcrop.fft.fft_along_axis(opened["t2m"], "time", tmp_path / "o.zarr", memory_per_task="1MiB")
    close(read(tmp_path / "o.zarr"), np.fft.fft(x.astype("f8"), axis=0), 2e-6)
    with pytest.raises(zcrop.InvalidArgumentError, match="decoded by xarray"):
        zcrop.fft.fft_along_axis(opened["packed"], "time", tmp_path / "p.zarr")
    with pytest.raises(TypeError, match="in memory"):
        zcrop.fft.fft_along_axis(opened["t2m"].load(), "time", tmp_path / "q.zarr")


def _download(s3, bucket: str, prefix: str, to: Path) -> list[str]:
    """Copies every object under ``prefix/`` into ``to``; returns their keys."""
    client = s3.client()
    keys = [
        o["Key"]
        for page in client.get_paginator("list_objects_v2").paginate(
            Bucket=bucket, Prefix=f"{prefix}/"
        )
        for o in page.get("Contents", [])
    ]
    for key in keys:
        dest = to / key[len(prefix) + 1 :]
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(client.get_object(Bucket=bucket, Key=key)["Body"].read())
    return keys


@pytest.mark.parametrize("engine", ["local", "dask", "cubed"])
def test_object_store_source_target_and_work_directory(engine, data, client, s3, tmp_path):
    """A public dataset read anonymously, transformed into a private bucket, with the job's
    state there too (work_dir given, or beside the target): zarr-python reads the target
    (downloaded) equal to numpy.fft, and the work directory is gone."""
    path, x = data
    s3.upload_tree("fft-public", Path(path), "era5/in.zarr", public=True)
    bucket = f"fft-out-{engine}"
    s3.client().create_bucket(Bucket=bucket)
    anon = {"endpoint_url": s3.endpoint, "region": "us-east-1", "anon": True}
    target = f"s3://{bucket}/spectra/o.zarr"
    kwargs: dict = {"work_dir": f"s3://{bucket}/scratch"} if engine == "dask" else {}
    if engine == "cubed":
        # Cubed's own intermediate store (unused by these tasks) stays local.
        kwargs["spec"] = cubed.Spec(work_dir=str(tmp_path / "cubed"), allowed_mem="500MB")
    report = run(
        engine, client, "s3://fft-public/era5/in.zarr", "time", target,
        memory_per_task=SMALL, storage_options=s3.options, source_storage_options=anon,
        **kwargs,
    )
    assert report.path == target and report.strategy == "four_step"
    got = tmp_path / "got.zarr"
    _download(s3, bucket, "spectra/o.zarr", got)
    close(read(got), np.fft.fft(x.astype("f8"), axis=1), 2e-6)
    assert zarr.open_array(str(got), mode="r").attrs["zcrop_fft"]["axis"] == 1
    left = s3.client().list_objects_v2(Bucket=bucket, Prefix="scratch/").get("KeyCount", 0)
    left += s3.client().list_objects_v2(Bucket=bucket, Prefix="spectra/o.zarr.zcrop-fft/").get(
        "KeyCount", 0
    )
    assert left == 0
    # The finished target is refused unless overwrite=True, as on a filesystem.
    with pytest.raises(zcrop.InvalidArgumentError, match="exists"):
        run(engine, client, "s3://fft-public/era5/in.zarr", 1, target,
            storage_options=s3.options, source_storage_options=anon, **kwargs)
    run(engine, client, "s3://fft-public/era5/in.zarr", 1, target, overwrite=True,
        storage_options=s3.options, source_storage_options=anon, **kwargs)


def test_an_opened_array_keeps_its_storage_options(data, s3, tmp_path):
    """A zcrop.Array opened from a URL is read with the options it was opened with; the local
    engine's temporaries cannot go to a URL."""
    path, x = data
    s3.upload_tree("fft-opened", Path(path), "in.zarr")
    source = zcrop.open_array("s3://fft-opened/in.zarr", storage_options=s3.options)
    zcrop.fft.fft_along_axis(source, "time", tmp_path / "o.zarr", memory_per_task=SMALL)
    close(read(tmp_path / "o.zarr"), np.fft.fft(x.astype("f8"), axis=1), 2e-6)
    with pytest.raises(zcrop.InvalidArgumentError, match="local directory"):
        zcrop.fft.fft_along_axis(
            source, "time", tmp_path / "p.zarr", work_dir="s3://fft-opened/work"
        )


def _weather(tmp_path: Path, **open_kwargs):
    """An hourly dataset (two variables along time, one without, a time-dependent coordinate)
    written by xarray, opened with engine="zcrop"."""
    xr = pytest.importorskip("xarray")
    rng = np.random.default_rng(5)
    times = np.arange("2020-01-01T00", "2020-01-11T00", dtype="datetime64[h]").astype(
        "datetime64[ns]"
    )
    lat = np.array([10.0, 20.0, 30.0])
    lon = np.array([0.0, 90.0])
    shape = (times.size, lat.size, lon.size)
    ds = xr.Dataset(
        {
            "t2m": (("time", "lat", "lon"), rng.standard_normal(shape).astype("f4")),
            "u10": (("time", "lat", "lon"), rng.standard_normal(shape).astype("f4")),
            "orography": (("lat", "lon"), rng.standard_normal((3, 2)).astype("f4")),
        },
        coords={"time": times, "lat": ("lat", lat, {"units": "degrees_north"}), "lon": lon,
                "step": ("time", np.arange(times.size))},
        attrs={"title": "hourly"},
    )
    enc = {v: {"chunks": (16, 3, 2), "_FillValue": None} for v in ("t2m", "u10")}
    ds.to_zarr(tmp_path / "w.zarr", encoding=enc, consolidated=False, zarr_format=3)
    return ds, xr.open_dataset(tmp_path / "w.zarr", engine="zcrop", **open_kwargs)


@pytest.mark.parametrize("engine", ["local", "dask"])
def test_dataset_in_dataset_out(engine, client, tmp_path):
    """Every variable along time transformed into one group, with a frequency coordinate in
    cycles per second from the hourly spacing; xarray's own zarr backend reads the same."""
    xr = pytest.importorskip("xarray")
    ds, opened = _weather(tmp_path)
    kwargs = {"client": client} if engine == "dask" else {}
    out = zcrop.fft.fft_dataset(
        opened, "time", tmp_path / "spec.zarr", memory_per_task="1MiB", engine=engine, **kwargs
    )
    assert set(out.data_vars) == {"t2m", "u10"}
    assert out["t2m"].dims == ("freq_time", "lat", "lon")
    np.testing.assert_array_equal(out["freq_time"], np.fft.fftfreq(240, 3600.0))
    assert out["freq_time"].attrs["units"] == "s-1"
    np.testing.assert_array_equal(out["lat"], ds["lat"])
    assert out["lat"].attrs["units"] == "degrees_north"
    assert "step" not in out.coords and out.attrs["title"] == "hourly"
    for name in ("t2m", "u10"):
        close(out[name].values, np.fft.fft(ds[name].values.astype("f8"), axis=0), 2e-6)
    theirs = xr.open_zarr(tmp_path / "spec.zarr", consolidated=False)
    xr.testing.assert_identical(theirs.load(), out.load())
    # Existing targets: refused, then replaced; a directory that is not a group is kept.
    with pytest.raises(zcrop.InvalidArgumentError, match="exists"):
        zcrop.fft.fft_dataset(opened, "time", tmp_path / "spec.zarr")
    again = zcrop.fft.fft_dataset(
        opened, "time", tmp_path / "spec.zarr", variables=["u10"], overwrite=True
    )
    assert set(again.data_vars) == {"u10"}
    # Storage options meant for a source's bucket do not trouble a local target.
    zcrop.fft.fft_dataset(
        opened, "time", tmp_path / "opts.zarr", variables=["u10"], storage_options={"anon": True}
    )
    (tmp_path / "keep").mkdir()
    (tmp_path / "keep" / "notes.txt").write_text("keep")
    with pytest.raises(zcrop.InvalidArgumentError, match="not a Zarr group"):
        zcrop.fft.fft_dataset(opened, "time", tmp_path / "keep", overwrite=True)
    assert (tmp_path / "keep" / "notes.txt").exists()


def test_frequencies_from_cf_times_and_uneven_labels(tmp_path):
    """Undecoded CF times give the same frequencies as decoded ones; uneven labels, a
    variable without the dimension and a missing dimension are refused."""
    xr = pytest.importorskip("xarray")
    _, raw = _weather(tmp_path, decode_times=False)
    assert "since" in raw["time"].attrs["units"]
    freq, attrs = zcrop.fft.frequencies(raw["time"], raw.sizes["time"])
    np.testing.assert_allclose(freq, np.fft.fftfreq(240, 3600.0), rtol=1e-12)
    assert attrs["units"] == "s-1"
    freq, attrs = zcrop.fft.frequencies(raw["lat"], 3)
    np.testing.assert_allclose(freq, np.fft.fftfreq(3, 10.0))
    assert attrs["units"] == "1/(degrees_north)"
    uneven = xr.DataArray([0.0, 1.0, 3.0], dims="x", name="x")
    with pytest.raises(zcrop.InvalidArgumentError, match="evenly spaced"):
        zcrop.fft.frequencies(uneven, 3)
    with pytest.raises(ValueError, match="not data variables"):
        zcrop.fft.fft_dataset(raw, "time", tmp_path / "o.zarr", variables=["orography"])
    with pytest.raises(ValueError, match="no dimension"):
        zcrop.fft.fft_dataset(raw, "level", tmp_path / "o.zarr")


def test_a_worker_whose_environment_cannot_reach_the_bucket_is_named(data, s3, tmp_path):
    """Without storage_options each process finds the store from its environment (as with
    AWS_* variables on a cluster): a worker whose environment points elsewhere is named before
    any task is submitted, and nothing is written to the job's work directory after that."""
    path, _ = data
    s3.upload_tree("fft-env", Path(path), "in.zarr")
    env = {"AWS_ENDPOINT_URL": s3.endpoint, "AWS_REGION": "us-east-1",
           "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
           "ZCROP_OBJECT_MAX_RETRIES": "0"}
    with pytest.MonkeyPatch.context() as mp:
        for k, v in env.items():
            mp.setenv(k, v)
        with (
            distributed.LocalCluster(n_workers=1, threads_per_worker=1, dashboard_address=None)
            as cluster,
            distributed.Client(cluster) as c,
        ):
            with socket_closed_port() as dead:
                elsewhere = {**os.environ, "AWS_ENDPOINT_URL": f"http://127.0.0.1:{dead}"}
                lost = subprocess.Popen(
                    [sys.executable, "-m", "distributed.cli.dask_worker",
                     cluster.scheduler_address, "--nthreads", "1", "--no-nanny",
                     "--no-dashboard"],
                    env=elsewhere, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                )
                try:
                    c.wait_for_workers(2, timeout=60)
                    with pytest.raises(zcrop.InvalidArgumentError, match="1 worker") as e:
                        zcrop.fft.fft_along_axis(
                            "s3://fft-env/in.zarr", 1, "s3://fft-env/out.zarr",
                            engine="dask", client=c, memory_per_task=SMALL,
                        )
                    assert f"127.0.0.1:{dead}" in str(e.value)
                finally:
                    lost.send_signal(signal.SIGTERM)
                    with contextlib.suppress(subprocess.TimeoutExpired):
                        lost.wait(30)
                    lost.kill()
    listed = s3.client().list_objects_v2(Bucket="fft-env", Prefix="out.zarr.zcrop-fft/done/")
    assert listed.get("KeyCount", 0) == 0


@contextlib.contextmanager
def socket_closed_port():
    """A loopback port nothing listens on."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    yield port
