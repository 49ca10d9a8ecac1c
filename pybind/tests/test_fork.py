"""Fork safety: a process forked from one that has used zcrop (opened, read, iterated a Loader)
gets fresh runtime state on its first zcrop call, and everything opened in the parent keeps
working in the child: arrays, groups, chunk caches, asyncio, and a half-iterated Loader, which
continues exactly where its consumer was. torch DataLoader workers started by fork, forkserver
or spawn, before or after the parent used zcrop, from local files or S3, give the batches of
``num_workers=0``, lock none of their memory, and (on a CUDA machine) serve a process that
initialised CUDA and registered its ring buffers; shutdown, Ctrl-C and a killed worker behave
as torch says; a forked child's private memory stays small (copy-on-write intact) and a long
run does not leak.

Every scenario runs in its own process (this file, run as a script: ``python test_fork.py
<scenario> <json params>``), started in a new session and killed with its whole process group
when it runs past its time, so that a hang fails its test instead of blocking the run. The
scenario writes what it saw to a pickle, and the test compares it with numpy's and zarr-python's
values. Top-level imports stay light (no torch, no zarr): spawn and forkserver workers import
this module again.
"""

from __future__ import annotations

import contextlib
import json
import os
import pickle
import re
import select
import signal
import subprocess
import sys
import time
import traceback

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork (POSIX)")

SHAPE = (8, 3, 64, 64)
CHUNKS = (1, 1, 32, 32)
SHARDS = (2, 3, 64, 64)
NAMES = ("plain", "sharded")
CROP = (2, 3, 16, 16)
BUCKET = "zcrop-fork"
STEPS, BATCH = 6, 2


def expected() -> dict[str, np.ndarray]:
    """The values of the test arrays (written by zarr-python)."""
    rng = np.random.default_rng(1234)
    return {n: rng.integers(0, 2**16, size=SHAPE, dtype=np.uint16) for n in NAMES}


# =============================================================================================
# The scenario side: runs in a subprocess (``__main__``) and in its forked children.
# =============================================================================================


class ChildFailed(AssertionError):
    """A forked child raised, ran past its time, or exited abnormally."""


def _read_all(fd: int, pid: int, timeout: float) -> bytes:
    """Reads ``fd`` to its end, killing process ``pid`` if that takes over ``timeout`` s."""
    deadline = time.monotonic() + timeout
    parts = []
    while True:
        left = deadline - time.monotonic()
        ready = select.select([fd], [], [], max(0.0, left))[0] if left > 0 else []
        if not ready:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(fd)
            raise ChildFailed(f"forked child {pid} sent nothing for {timeout} s (hung?)")
        chunk = os.read(fd, 1 << 20)
        if not chunk:
            os.close(fd)
            return b"".join(parts)
        parts.append(chunk)


def _wait(pid: int, timeout: float) -> int:
    """The exit status of child ``pid`` (``-signal`` when killed), killing it after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            raise ChildFailed(f"forked child {pid} did not exit within {timeout} s (hung?)")
        time.sleep(0.01)


def _mp_child(fn, conn) -> None:
    try:
        out = ("ok", fn())
    except BaseException:
        out = ("error", traceback.format_exc())
    conn.send(out)
    conn.close()


def in_fork(fn, how: str = "os.fork", timeout: float = 60.0, exit: str = "os._exit"):
    """Runs ``fn()`` in a forked child (``os.fork`` or a multiprocessing ``fork`` Process) and
    returns what it returned; raises :class:`ChildFailed` with the child's traceback if it
    raised, hung or did not exit with status 0. ``exit="sys.exit"`` (``os.fork`` only): the
    child ends with a normal interpreter exit (finalizers, atexit, zcrop's destructors) instead
    of ``os._exit``."""
    if how == "os.fork":
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child
            try:
                os.close(r)
                try:
                    out = ("ok", fn())
                except BaseException:
                    out = ("error", traceback.format_exc())
                with os.fdopen(w, "wb") as f:
                    pickle.dump(out, f)
            except BaseException:
                os._exit(3)
            if exit == "sys.exit":
                # Unwinds this (copied) call stack and exits the interpreter normally.
                sys.exit(0)
            os._exit(0)
        os.close(w)
        data = _read_all(r, pid, timeout)
        code = _wait(pid, timeout)
        if not data:
            raise ChildFailed(f"forked child {pid} sent nothing (exit status {code})")
        kind, value = pickle.loads(data)
        if kind == "error":
            raise ChildFailed(f"forked child raised:\n{value}")
        if code != 0:
            raise ChildFailed(f"forked child {pid} exited with status {code} after its work")
        return value
    if how == "mp-fork":
        import multiprocessing

        ctx = multiprocessing.get_context("fork")
        recv, send = ctx.Pipe(duplex=False)
        p = ctx.Process(target=_mp_child, args=(fn, send))
        p.start()
        send.close()
        if not recv.poll(timeout):
            p.kill()
            p.join()
            raise ChildFailed(f"fork-context Process sent nothing for {timeout} s (hung?)")
        kind, value = recv.recv()
        p.join(timeout)
        if p.exitcode is None:
            p.kill()
            p.join()
            raise ChildFailed("fork-context Process did not exit after its work (hung?)")
        if kind == "error":
            raise ChildFailed(f"fork-context Process raised:\n{value}")
        if p.exitcode != 0:
            raise ChildFailed(f"fork-context Process exited with {p.exitcode}")
        return value
    raise ValueError(how)


def _path(p: dict, name: str) -> str:
    return f"{p['root']}/{name}"


def _open(p: dict, name: str, **kw):
    import zcrop

    return zcrop.open_array(_path(p, name), storage_options=p.get("options"), **kw)


def _sources(p: dict, crop=CROP) -> dict:
    import zcrop

    return {
        n: zcrop.Source(_path(p, n), crop, storage_options=p.get("options"), name=n) for n in NAMES
    }


def _snapshot(batch: dict) -> tuple:
    """A batch as plain, owned values: (index or None, {source: ndarray}, meta)."""
    arrays = {n: np.array(np.asarray(batch[n]), copy=True) for n in NAMES}
    return (batch.get("batch"), arrays, batch["meta"])


def _private_kb() -> dict[str, int]:
    """This process's memory in kB: Rss, and private (Private_Clean + Private_Dirty: pages no
    other process maps, so not shared with the parent through copy-on-write)."""
    fields: dict[str, int] = {}
    try:
        text = open("/proc/self/smaps_rollup").read()
    except FileNotFoundError:  # before Linux 4.14: sum every mapping
        text = open("/proc/self/smaps").read()
    for line in text.splitlines():
        m = re.match(r"(\w+):\s+(\d+) kB", line)
        if m:
            fields[m.group(1)] = fields.get(m.group(1), 0) + int(m.group(2))
    return {
        "rss": fields.get("Rss", 0),
        "private": fields.get("Private_Clean", 0) + fields.get("Private_Dirty", 0),
    }


def _status_kb(field: str, pid: int | str = "self") -> int:
    """A kB field of /proc/PID/status (VmRSS, VmLck, ...)."""
    for line in open(f"/proc/{pid}/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} in /proc/{pid}/status")


# --- (a) arrays and groups across fork ---------------------------------------------------------


async def _async_read(p: dict):
    import zcrop

    a = await zcrop.open_async(_path(p, "sharded"), storage_options=p.get("options"))
    return await a.getitem((slice(1, 5), 2, slice(None), slice(3, 40)))


ORIGINS = [[0, 0, 0, 0], [5, 0, 30, 17], [6, 0, 48, 48]]


def scenario_reads(p: dict) -> dict:
    """Opens and reads in the parent (unless ``used`` is false), forks, reads in the child: the
    parent's objects and freshly opened ones; then reads again in the parent."""
    import asyncio

    import zcrop

    out: dict = {}
    objs: dict = {}
    if p["used"]:
        objs["plain"] = _open(p, "plain", chunk_cache="4M")
        objs["group"] = zcrop.open_group(p["root"], storage_options=p.get("options"))
        objs["sharded"] = objs["group"]["sharded"]
        out["parent_before"] = {
            "plain": objs["plain"][...],
            "sharded": objs["sharded"][2:7, 1, 3:60, :],
            "crops": objs["plain"].read_crops(ORIGINS, CROP).copy(),
            "async": asyncio.run(_async_read(p)),
        }

    def child() -> dict:
        got: dict = {}
        if p["used"]:
            got["same_plain"] = objs["plain"][...]  # through the chunk cache filled in the parent
            got["same_sharded"] = objs["sharded"][...]
            got["same_crops"] = objs["plain"].read_crops(ORIGINS, CROP).copy()
            got["group_keys"] = sorted(objs["group"].array_keys())
            got["group_sharded"] = objs["group"]["sharded"][2:7, 1, 3:60, :]
        got["fresh_plain"] = _open(p, "plain")[...]
        got["fresh_sharded"] = _open(p, "sharded")[2:7, 1, 3:60, :]
        g = zcrop.open_group(p["root"], storage_options=p.get("options"))
        got["fresh_group_keys"] = sorted(g.array_keys())
        got["fresh_group_plain"] = g["plain"][1:3]
        got["fresh_crops"] = _open(p, "sharded").read_crops(ORIGINS, CROP).copy()
        got["async"] = asyncio.run(_async_read(p))
        return got

    out["child"] = in_fork(child, how=p["how"], exit=p.get("exit", "os._exit"))
    # The parent goes on reading: through its own objects and new ones.
    after = {"fresh_plain": _open(p, "plain")[...], "async": asyncio.run(_async_read(p))}
    if p["used"]:
        after["same_plain"] = objs["plain"][...]
        after["same_sharded"] = objs["sharded"][2:7, 1, 3:60, :]
    out["parent_after"] = after
    return out


# --- (b), (c) torch DataLoader workers --------------------------------------------------------


def _dataset(p: dict, steps=STEPS, batch_size=BATCH, seed=3):
    import zcrop.torch

    return zcrop.torch.ZcropDataset(_sources(p), batch_size=batch_size, steps=steps, seed=seed)


def _context(method: str):
    import multiprocessing

    ctx = multiprocessing.get_context(method)
    if method == "forkserver":
        # The server imports these once, not each worker (saves seconds per worker); importing
        # zcrop does not use it.
        ctx.set_forkserver_preload(["torch", "zcrop.torch"])
    return ctx


def _collect(ds, locked: list | None = None, **kw) -> list:
    """The DataLoader's batches as snapshots; with workers and ``locked``, each worker's locked
    memory (kB) is appended to it after the second batch, while the workers' loaders are open."""
    import torch.utils.data

    if kw.get("num_workers", 0) > 0:
        kw.setdefault("timeout", 60)
    it = iter(torch.utils.data.DataLoader(ds, batch_size=None, **kw))
    out = []
    for b in it:
        out.append(_snapshot(b))
        if locked is not None and len(out) == 2:
            locked.extend(_status_kb("VmLck", w.pid) for w in it._workers)
    return out


def _use_zcrop(p: dict) -> None:
    """What "the parent used zcrop" means here: a Loader iterated (reads in flight, threads
    running, ring buffers held) and an array read."""
    import zcrop

    ld = zcrop.Loader(_sources(p), batch_size=2, seed=99, steps=20, prefetch=3)
    held = [next(ld) for _ in range(2)]
    assert held[0]["plain"].shape == (2, *CROP)
    _open(p, "sharded")[...]
    # Kept alive across the fork on purpose: an open loader with reads in flight.
    _KEEP.append((ld, held))


_KEEP: list = []


def scenario_dataloader(p: dict) -> dict:
    """num_workers=2 workers with start method ``method``: first before this process has used
    zcrop, then after; and the num_workers=0 reference. Also the locked memory of this process
    (its loader's ring buffers) and of the workers."""
    import warnings

    warnings.filterwarnings("ignore", message=".*os.fork.*")
    ctx = _context(p["method"])
    out = {"before": _collect(_dataset(p), num_workers=2, multiprocessing_context=ctx)}
    _use_zcrop(p)
    out["parent_pin"] = _KEEP[-1][0].pin_state
    out["parent_locked_kb"] = _status_kb("VmLck")
    out["worker_locked_kb"] = []
    out["after"] = _collect(_dataset(p), out["worker_locked_kb"], num_workers=2,
                            multiprocessing_context=ctx)
    out["zero"] = _collect(_dataset(p))
    return out


def scenario_cuda_parent(p: dict) -> dict:
    """A training script's order: CUDA initialised by torch and zcrop's ring buffers registered
    with it in this process, then DataLoader workers with start method ``method`` and
    ``pin_memory=True``, their batches copied to the GPU with ``non_blocking=True``."""
    import warnings

    import torch
    import torch.utils.data

    warnings.filterwarnings("ignore", message=".*os.fork.*")
    torch.cuda.init()
    weights = torch.ones(4, device="cuda")
    _use_zcrop(p)
    out = {"parent_pin": _KEEP[-1][0].pin_state, "zero": _collect(_dataset(p))}
    dl = torch.utils.data.DataLoader(
        _dataset(p), batch_size=None, num_workers=2, pin_memory=True, timeout=60,
        multiprocessing_context=_context(p["method"]),
    )
    got, on_gpu, pinned = [], [], []
    for b in dl:
        got.append(_snapshot(b))
        pinned.append(all(b[n].is_pinned() for n in NAMES))
        on_gpu.append({n: b[n].to("cuda", non_blocking=True) for n in NAMES})
    torch.cuda.synchronize()
    out["workers"] = got
    out["pinned"] = pinned
    out["gpu"] = [{n: t.cpu().numpy() for n, t in d.items()} for d in on_gpu]
    out["weights"] = float(weights.sum())
    return out


_INIT_SEEN: list = []


def _worker_init(worker_id: int) -> None:
    """A worker_init_fn that uses zcrop in the worker before the dataset does."""
    import torch.utils.data

    info = torch.utils.data.get_worker_info()
    assert info is not None and info.id == worker_id
    a = _open(json.loads(os.environ["ZCROP_FORK_TEST"]), "plain")
    got = a[worker_id, 0, :8, :8]
    assert np.array_equal(got, expected()["plain"][worker_id, 0, :8, :8]), "worker_init_fn read"
    _INIT_SEEN.append(int(got.astype(np.int64).sum()))


def scenario_dataloader_options(p: dict) -> dict:
    """Fork workers after the parent used zcrop, with persistent_workers over two epochs,
    pin_memory, prefetch_factor=4 and a worker_init_fn that reads with zcrop."""
    import warnings

    warnings.filterwarnings("ignore", message=".*pin_memory.*")
    warnings.filterwarnings("ignore", message=".*os.fork.*")
    os.environ["ZCROP_FORK_TEST"] = json.dumps(p)
    _use_zcrop(p)
    zero = _collect(_dataset(p, steps=7))
    import torch.utils.data

    dl = torch.utils.data.DataLoader(
        _dataset(p, steps=7), batch_size=None, num_workers=2, multiprocessing_context="fork",
        persistent_workers=True, pin_memory=True, prefetch_factor=4, timeout=60,
        worker_init_fn=_worker_init,
    )
    epochs, pids = [], []
    for _ in range(2):
        it = iter(dl)
        epochs.append([_snapshot(b) for b in it])
        pids.append(sorted(w.pid for w in it._workers))
    # A worker's queue pickles batches later, on its feeder thread; with prefetch_factor=4 a
    # worker reads up to 4 batches ahead of it. A slow feeder (here: made slow) must not make
    # the worker's loader run out of ring buffers.
    class SlowFeeder(torch.utils.data.IterableDataset):
        """The dataset's batches, each with a first entry that takes 0.2 s to pickle (fork
        workers: the dataset is not pickled itself)."""

        def __init__(self, ds) -> None:
            self.ds = ds

        def __iter__(self):
            for batch in self.ds:
                yield {"slow": _SlowToPickle(), **batch}

    slow = torch.utils.data.DataLoader(
        SlowFeeder(_dataset(p, steps=7)), batch_size=None, num_workers=2,
        multiprocessing_context="fork", prefetch_factor=4, timeout=60,
    )
    slow_batches = [_snapshot(b) for b in slow]
    return {"zero": zero, "epochs": epochs, "worker_pids": pids, "slow_feeder": slow_batches}


class _SlowToPickle:
    def __reduce__(self):
        time.sleep(0.2)
        return (_SlowToPickle, ())


# --- (d) a Loader continued in a forked child ------------------------------------------------


def scenario_loader_continues(p: dict) -> dict:
    """A Loader iterated k batches in the parent; a forked child takes the rest; then the parent
    takes the rest of its own; and a fresh Loader's batches for reference."""
    import zcrop

    k, n = p["k"], p["n"]

    def make():
        return zcrop.Loader(_sources(p), batch_size=3, seed=7, steps=k + n, prefetch=3)

    ld = make()
    first = [next(ld) for _ in range(k)]
    held = first[-1]  # a view of a ring buffer the parent still holds at the fork
    held_copy = _snapshot(held)
    first = [_snapshot(b) for b in first[:-1]] + [held_copy]

    def child() -> dict:
        intact = all(np.array_equal(held[m], held_copy[1][m]) for m in NAMES)
        step = ld.step
        rest = [_snapshot(b) for b in ld]
        ld.close()  # the loader's teardown in the child
        return {"step": step, "rest": rest, "held_intact": intact}

    out = {"child": in_fork(child, exit=p.get("exit", "os._exit"))}
    out["parent_step"] = ld.step
    out["parent_rest"] = [_snapshot(b) for b in ld]
    out["parent_first"] = first
    out["fresh"] = [_snapshot(b) for b in make()]
    return out


# --- (e), (f) shutdown, Ctrl-C and a killed worker --------------------------------------------


def _plain_check(p: dict) -> bool:
    want = expected()["plain"]
    return bool(np.array_equal(_open(p, "plain")[...], want))


def scenario_shutdown(p: dict) -> dict:
    """Deletes a fork-worker DataLoader iterator mid-epoch; how long that takes, the workers'
    exit codes, and whether zcrop reads right afterwards."""
    import gc

    import torch.utils.data

    _use_zcrop(p)
    dl = torch.utils.data.DataLoader(
        _dataset(p, steps=1000), batch_size=None, num_workers=2,
        multiprocessing_context="fork", timeout=60,
    )
    it = iter(dl)
    got = [_snapshot(next(it)) for _ in range(3)]
    workers = list(it._workers)
    t = time.monotonic()
    del it
    gc.collect()
    seconds = time.monotonic() - t
    for w in workers:
        w.join(10)
    return {
        "seconds": seconds,
        "exitcodes": [w.exitcode for w in workers],
        "batches": [g[0] for g in got],
        "reads_after": _plain_check(p),
    }


def scenario_sigint(p: dict) -> None:
    """Iterates an endless fork-worker DataLoader (after using zcrop) until interrupted; prints
    ``ready <worker pids>`` once batches flow."""
    import torch.utils.data

    _use_zcrop(p)
    dl = torch.utils.data.DataLoader(
        _dataset(p, steps=None), batch_size=None, num_workers=2,
        multiprocessing_context="fork", timeout=60,
    )
    it = iter(dl)
    for i, _ in enumerate(it):
        if i == 2:
            print("ready", *[w.pid for w in it._workers], flush=True)
        time.sleep(0.01)


def scenario_sigkill(p: dict) -> dict:
    """Kills a fork worker with SIGKILL mid-iteration; what the DataLoader raised, and whether
    zcrop reads right in this process afterwards."""
    import torch.multiprocessing
    import torch.utils.data

    # With the default strategy a batch the killed worker had queued can no longer be fetched
    # (its file descriptor was to come from the dead worker), and torch may then raise that
    # ConnectionResetError before its own check of the workers: a race in torch, not zcrop's.
    # Shared memory by file name takes it away.
    torch.multiprocessing.set_sharing_strategy("file_system")
    _use_zcrop(p)
    # torch learns of the death from SIGCHLD at once, or at the latest when a wait times out.
    dl = torch.utils.data.DataLoader(
        _dataset(p, steps=None), batch_size=None, num_workers=2,
        multiprocessing_context="fork", timeout=30,
    )
    it = iter(dl)
    for _ in range(2):
        next(it)
    victim = it._workers[0].pid
    os.kill(victim, signal.SIGKILL)
    error, batches_after = None, 0
    t = time.monotonic()
    deadline = t + 60
    try:
        while time.monotonic() < deadline:
            next(it)
            batches_after += 1
    except RuntimeError as e:
        error = f"{type(e).__name__}: {e}"
    seconds = time.monotonic() - t
    del it
    return {
        "victim": victim,
        "error": error,
        "seconds": seconds,
        "batches_after": batches_after,
        "reads_after": _plain_check(p),
    }


# --- (g) memory -------------------------------------------------------------------------------


def scenario_memory(p: dict) -> dict:
    """A parent holding a large resident numpy array, after using zcrop, forks a child that
    opens and reads arrays and runs a Loader for 50 batches: the child's private memory, measured
    with the loader still open."""
    import zcrop

    big = np.ones(p["parent_mib"] << 17, dtype=np.float64)  # MiB -> 8-byte elements
    _use_zcrop(p)
    parent = _private_kb()

    def child() -> dict:
        start = _private_kb()
        for name in NAMES:
            _open(p, name)[...]
        ld = zcrop.Loader(_sources(p), batch_size=4, seed=5, steps=50)
        n = sum(1 for _ in ld)
        end = _private_kb()
        ld.close()
        return {"start": start, "end": end, "batches": n, "big_sum": float(big[::4096].sum())}

    return {"parent": parent, "child": in_fork(child, timeout=120)}


def scenario_leak(p: dict) -> dict:
    """In a child forked after the parent used zcrop: VmRSS after batch 1000 and after the last of
    ``batches`` tiny batches."""
    _use_zcrop(p)

    def child() -> dict:
        import zcrop

        ld = zcrop.Loader(_sources(p, crop=(1, 1, 2, 2)), batch_size=1, seed=1,
                          steps=p["batches"])
        rss, t = {}, time.monotonic()
        for i, _ in enumerate(ld, 1):
            if i in (1, 1000):
                rss[i] = _status_kb("VmRSS")
        rss["last"] = _status_kb("VmRSS")
        return {"rss": rss, "batches": i, "seconds": time.monotonic() - t}

    return in_fork(child, timeout=120)


def scenario_sampling(p: dict) -> dict:
    """The parallel kernels of sampling (valid_windows' tests, bulk position draws) in a child
    forked after the parent ran them: they must run on the child's own threads."""
    import zcrop

    src = zcrop.Source(_path(p, "sharded"), (2, 3, 16, 16), name="s", dims=["t", 0, "y", "x"])
    pos = ["t", "y", "x"]

    def work() -> tuple:
        mask = zcrop.valid_windows(src, pos, invalid=[7], cache=False)
        samples = zcrop.Samples(src, positions=pos, valid=mask, mode="epoch", stride=[1, 1, 1])
        return mask.runs.tolist(), samples._native.positions(0, 50_000).tolist()

    parent = work()
    return {"parent": parent, "child": in_fork(work, timeout=60)}


SCENARIOS = {
    "reads": scenario_reads,
    "sampling": scenario_sampling,
    "dataloader": scenario_dataloader,
    "dataloader_options": scenario_dataloader_options,
    "cuda_parent": scenario_cuda_parent,
    "loader_continues": scenario_loader_continues,
    "shutdown": scenario_shutdown,
    "sigint": scenario_sigint,
    "sigkill": scenario_sigkill,
    "memory": scenario_memory,
    "leak": scenario_leak,
}


# =============================================================================================
# The pytest side.
# =============================================================================================


def _env() -> dict[str, str]:
    """The environment for scenario processes: this process's way to zcrop and to this file."""
    import zcrop

    paths = [os.path.dirname(os.path.dirname(os.path.abspath(zcrop.__file__))), HERE]
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def start(name: str, params: dict) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, os.path.abspath(__file__), name, json.dumps(params)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
        start_new_session=True,
    )


def run(name: str, params: dict, tmp_path, timeout: float = 120):
    """Runs scenario ``name`` in a new process (and session) and returns what it returned; fails
    with its output if it raised or ran past ``timeout`` s (then its whole process group,
    forked children and workers included, is killed)."""
    out = tmp_path / f"{name}-{time.monotonic_ns()}.pkl"
    proc = start(name, {**params, "out": str(out)})
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc.pid)
        stdout, stderr = proc.communicate()
        pytest.fail(f"scenario {name} {params} ran past {timeout} s (hung?)\n"
                    f"stdout: {stdout[-3000:]}\nstderr: {stderr[-6000:]}")
    finally:
        _kill_group(proc.pid)  # strays (a child that outlived its parent) go too
    if proc.returncode != 0:
        pytest.fail(f"scenario {name} {params} exited with {proc.returncode}\n"
                    f"stdout: {stdout[-3000:]}\nstderr: {stderr[-6000:]}")
    return pickle.loads(out.read_bytes())


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict:
    """A Zarr v3 group written by zarr-python: ``plain`` (chunks (1, 1, 32, 32)) and ``sharded``
    (shards (2, 3, 64, 64) of such chunks), both uint16 (8, 3, 64, 64)."""
    import zarr

    root = tmp_path_factory.mktemp("fork") / "d.zarr"
    g = zarr.open_group(str(root), mode="w", zarr_format=3)
    values = expected()
    g.create_array("plain", shape=SHAPE, chunks=CHUNKS, dtype="uint16")[...] = values["plain"]
    g.create_array("sharded", shape=SHAPE, chunks=CHUNKS, shards=SHARDS,
                   dtype="uint16")[...] = values["sharded"]
    return {"root": str(root), "options": None}


@pytest.fixture(scope="module")
def s3data(s3, data) -> dict:
    """The same group in moto's S3 server on loopback."""
    import pathlib

    s3.upload_tree(BUCKET, pathlib.Path(data["root"]), "d.zarr")
    return {"root": f"s3://{BUCKET}/d.zarr", "options": s3.options}


@pytest.fixture(params=["local", "s3"])
def store(request) -> dict:
    return request.getfixturevalue("data" if request.param == "local" else "s3data")


def crop_of(values: np.ndarray, origin) -> np.ndarray:
    return values[tuple(slice(o, o + c) for o, c in zip(origin, CROP))]


def assert_batches_equal(got: list, want: list, what: str) -> None:
    assert [b[0] for b in got] == [b[0] for b in want], f"{what}: batch order"
    for (i, arrays, meta), (_, ref, ref_meta) in zip(got, want):
        for n in NAMES:
            assert arrays[n].dtype == ref[n].dtype and arrays[n].shape == ref[n].shape, (what, i, n)
            assert np.array_equal(arrays[n], ref[n]), f"{what}: batch {i}, source {n!r} differs"
        assert meta == ref_meta, f"{what}: batch {i} metadata differs"


def assert_crops_of_the_arrays(batches: list) -> None:
    values = expected()
    for _, arrays, meta in batches:
        for j, m in enumerate(meta):
            for n in NAMES:
                want = crop_of(values[n], m["sources"][n]["origin"])
                np.testing.assert_array_equal(np.asarray(arrays[n][j]), want)


# --- (a) -------------------------------------------------------------------------------------


READS_CASES = [
    ("local", True, "os.fork", "os._exit"),
    ("local", True, "os.fork", "sys.exit"),
    ("local", True, "mp-fork", None),
    ("local", False, "os.fork", "os._exit"),
    ("local", False, "mp-fork", None),
    ("s3", True, "os.fork", "os._exit"),
    ("s3", True, "mp-fork", None),
    ("s3", False, "os.fork", "sys.exit"),
]


@pytest.mark.parametrize(
    "where,used,how,exit", READS_CASES,
    ids=[f"{w}-{'used' if u else 'unused'}-{h}-{e or 'mp'}" for w, u, h, e in READS_CASES],
)
def test_child_reads_arrays_and_groups_after_fork(request, tmp_path, where, used, how, exit):
    p = request.getfixturevalue("data" if where == "local" else "s3data")
    res = run("reads", {**p, "used": used, "how": how, "exit": exit}, tmp_path, timeout=90)
    v = expected()
    sub = v["sharded"][2:7, 1, 3:60, :]
    async_want = v["sharded"][1:5, 2, :, 3:40]
    crops = lambda a: np.stack([crop_of(a, o) for o in ORIGINS])  # noqa: E731
    child = res["child"]
    np.testing.assert_array_equal(child["fresh_plain"], v["plain"])
    np.testing.assert_array_equal(child["fresh_sharded"], sub)
    np.testing.assert_array_equal(child["fresh_group_plain"], v["plain"][1:3])
    np.testing.assert_array_equal(child["fresh_crops"], crops(v["sharded"]))
    np.testing.assert_array_equal(child["async"], async_want)
    assert child["fresh_group_keys"] == list(NAMES)
    after = res["parent_after"]
    np.testing.assert_array_equal(after["fresh_plain"], v["plain"])
    np.testing.assert_array_equal(after["async"], async_want)
    if used:
        before = res["parent_before"]
        np.testing.assert_array_equal(before["plain"], v["plain"])
        np.testing.assert_array_equal(before["sharded"], sub)
        np.testing.assert_array_equal(before["crops"], crops(v["plain"]))
        np.testing.assert_array_equal(before["async"], async_want)
        # The parent's own objects, in the child: array (with its chunk cache), group, members.
        np.testing.assert_array_equal(child["same_plain"], v["plain"])
        np.testing.assert_array_equal(child["same_sharded"], v["sharded"])
        np.testing.assert_array_equal(child["same_crops"], crops(v["plain"]))
        np.testing.assert_array_equal(child["group_sharded"], sub)
        assert child["group_keys"] == list(NAMES)
        np.testing.assert_array_equal(after["same_plain"], v["plain"])
        np.testing.assert_array_equal(after["same_sharded"], sub)


# --- (b) -------------------------------------------------------------------------------------


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_dataloader_workers_give_the_batches_of_num_workers_0(store, tmp_path, method):
    # One process per case: two workers before it has used zcrop, then two after (a Loader
    # with reads in flight kept open, an array read), then num_workers=0.
    res = run("dataloader", {**store, "method": method}, tmp_path, timeout=150)
    zero = res["zero"]
    assert [b[0] for b in zero] == list(range(STEPS))
    assert_crops_of_the_arrays(zero)
    assert_batches_equal(res["before"], zero, f"{method} workers, parent had not used zcrop")
    assert_batches_equal(res["after"], zero, f"{method} workers, parent had used zcrop")
    # Workers lock none of their memory (their batches reach the main process through shared
    # memory, and registering them with CUDA would start a context per worker); the parent's
    # own loader shows that locked ring buffers are counted.
    assert res["worker_locked_kb"] == [0, 0], res["worker_locked_kb"]
    if res["parent_pin"]["page_locked"]:
        assert res["parent_locked_kb"] > 0, res["parent_pin"]


def _cuda_available() -> bool:
    import torch

    return torch.cuda.is_available()


@pytest.mark.parametrize("method", ["fork", "forkserver", "spawn"])
def test_workers_of_a_process_that_uses_cuda(data, tmp_path, method):
    if not _cuda_available():
        pytest.skip("needs a CUDA GPU")
    res = run("cuda_parent", {**data, "method": method}, tmp_path, timeout=150)
    assert res["parent_pin"]["cuda_registered"], res["parent_pin"]
    assert res["weights"] == 4.0
    zero = res["zero"]
    assert [b[0] for b in zero] == list(range(STEPS))
    assert_crops_of_the_arrays(zero)
    assert_batches_equal(res["workers"], zero, f"{method} workers of a CUDA process")
    assert all(res["pinned"]), res["pinned"]
    for (i, arrays, _), gpu in zip(zero, res["gpu"]):
        for n in NAMES:
            assert np.array_equal(gpu[n], arrays[n]), f"batch {i}, {n!r}: copy to the GPU differs"


# --- (c) -------------------------------------------------------------------------------------


def test_persistent_pinned_prefetching_fork_workers_with_init_fn(data, tmp_path):
    res = run("dataloader_options", data, tmp_path, timeout=120)
    zero = res["zero"]
    assert [b[0] for b in zero] == list(range(7))
    assert_crops_of_the_arrays(zero)
    for e, epoch in enumerate(res["epochs"]):
        assert_batches_equal(epoch, zero, f"persistent fork workers, epoch {e}")
    assert res["worker_pids"][0] == res["worker_pids"][1], "persistent workers were restarted"
    assert_batches_equal(res["slow_feeder"], zero, "prefetch_factor=4, slow feeder thread")


# --- (d) -------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "where,exit", [("local", "os._exit"), ("local", "sys.exit"), ("s3", "os._exit")]
)
def test_a_loader_continues_in_a_forked_child_where_the_parent_was(request, tmp_path, where,
                                                                   exit):
    # sys.exit: the child then exits through the interpreter's finalization, which drops the
    # inherited loader's remaining buffers and threads' state.
    store = request.getfixturevalue("data" if where == "local" else "s3data")
    k, n = 3, 4
    res = run("loader_continues", {**store, "k": k, "n": n, "exit": exit}, tmp_path, timeout=90)
    fresh = res["fresh"]
    assert len(fresh) == k + n
    assert_crops_of_the_arrays(fresh)
    assert_batches_equal(res["parent_first"], fresh[:k], "parent, before the fork")
    child = res["child"]
    assert child["held_intact"], "a batch the parent held at the fork changed in the child"
    assert child["step"] == k
    assert len(child["rest"]) == n, "the child's loader did not stop after its steps"
    assert_batches_equal(child["rest"], fresh[k:], "child, continuing the parent's loader")
    assert res["parent_step"] == k
    assert_batches_equal(res["parent_rest"], fresh[k:], "parent, after the fork")


# --- (e) -------------------------------------------------------------------------------------


def test_deleting_a_fork_worker_iterator_mid_epoch_returns_promptly(data, tmp_path):
    res = run("shutdown", data, tmp_path, timeout=90)
    assert res["batches"] == [0, 1, 2]
    # torch joins each worker for up to 5 s before it terminates it: a worker stuck in zcrop's
    # teardown shows as a slow shutdown and exit code -15.
    assert res["seconds"] < 4.5, res
    assert res["exitcodes"] == [0, 0], res
    assert res["reads_after"], "the parent read wrong values after the workers were shut down"


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_ctrl_c_stops_a_fork_worker_dataloader_promptly(data):
    proc = start("sigint", data)
    try:
        deadline = time.monotonic() + 90
        line = ""
        while time.monotonic() < deadline:
            line = proc.stdout.readline()
            if not line or line.startswith("ready"):
                break
        if not line.startswith("ready"):
            _kill_group(proc.pid)
            out, err = proc.communicate()
            pytest.fail(f"the DataLoader never got going: {line!r}{out[-2000:]}\n{err[-6000:]}")
        workers = [int(x) for x in line.split()[1:]]
        assert len(workers) == 2
        sent = time.monotonic()
        os.killpg(proc.pid, signal.SIGINT)  # as Ctrl-C does: the whole foreground group
        try:
            _, err = proc.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            _kill_group(proc.pid)
            _, err = proc.communicate()
            pytest.fail(f"no exit within 30 s of SIGINT (hung)\n{err[-6000:]}")
        took = time.monotonic() - sent
        assert proc.returncode != 0
        assert "KeyboardInterrupt" in err, err[-6000:]
        assert took < 15, f"took {took:.1f} s to exit after SIGINT"
        deadline = time.monotonic() + 15
        while any(_alive(w) for w in workers) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert not any(_alive(w) for w in workers), "workers outlived the interrupted parent"
    finally:
        _kill_group(proc.pid)


# --- (f) -------------------------------------------------------------------------------------


def test_a_worker_killed_by_sigkill_fails_the_dataloader_as_torch_does(data, tmp_path):
    res = run("sigkill", data, tmp_path, timeout=120)
    err = res["error"]
    assert err is not None, f"no error in 60 s after killing worker {res['victim']}: {res}"
    # torch: "DataLoader worker (pid N) is killed by signal: Killed." or "DataLoader worker
    # (pid(s) N) exited unexpectedly".
    assert re.search(r"DataLoader worker \(pid(\(s\))? [\d, ]*\) (is killed by signal|exited "
                     r"unexpectedly)", err), err
    assert str(res["victim"]) in err, err
    assert res["reads_after"], "the parent read wrong values after its worker was killed"


# --- (g) -------------------------------------------------------------------------------------


def test_sampling_kernels_run_in_a_forked_child(data, tmp_path):
    res = run("sampling", data, tmp_path, timeout=120)
    assert res["child"] == res["parent"]
    assert len(res["parent"][1]) == 50_000 * 3


def test_a_forked_child_shares_the_parents_memory(data, tmp_path):
    res = run("memory", {**data, "parent_mib": 512}, tmp_path, timeout=120)
    child = res["child"]
    assert child["batches"] == 50
    assert child["big_sum"] == float(len(range(0, 512 << 17, 4096)))
    private_mb = child["end"]["private"] / 1024
    # RSS counts the parent's 512 MiB (shared, copy-on-write); private memory is what the child
    # copied or allocated.
    assert child["end"]["rss"] / 1024 > 512, child
    assert private_mb < 200, f"the forked child has {private_mb:.0f} MB of private memory: {res}"


def test_no_leak_over_many_batches_in_a_forked_child(data, tmp_path):
    batches = 10_000
    res = run("leak", {**data, "batches": batches}, tmp_path, timeout=120)
    assert res["batches"] == batches
    grew_mb = (res["rss"]["last"] - res["rss"][1000]) / 1024
    assert grew_mb < 20, f"VmRSS grew {grew_mb:.1f} MB from batch 1000 to {batches}: {res}"


# =============================================================================================

if __name__ == "__main__":
    # A process started with SIGINT ignored (a background job) passes that on; Ctrl-C must work.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    _name, _params = sys.argv[1], json.loads(sys.argv[2])
    _result = SCENARIOS[_name](_params)
    if "out" in _params:
        with open(_params["out"], "wb") as _f:
            pickle.dump(_result, _f)
