"""zcrop.torch with a real torch DataLoader: 0 and 2 workers give the same stream (no sample
duplicated or lost), pin_memory works, resume is exact."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.utils.data

import zcrop
import zcrop.torch as zt
from conftest import FIXTURES

WORKLOAD = str(FIXTURES / "data/v3_workload_4d_u2.zarr")
CROP = (2, 3, 16, 16)


def dataset(**kw):
    kw.setdefault("batch_size", 4)
    kw.setdefault("seed", 5)
    kw.setdefault("steps", 7)
    return zt.ZcropDataset(zcrop.Source(WORKLOAD, CROP, name="img", dtype="float32"), **kw)


def collect(ds, **dl_kwargs):
    # Workers start with the platform's default method (fork on Linux before Python 3.14),
    # from this process, where zcrop's threads are running.
    out = []
    for batch in torch.utils.data.DataLoader(ds, batch_size=None, **dl_kwargs):
        assert isinstance(batch["img"], torch.Tensor)
        assert batch["img"].dtype == torch.float32
        assert batch["img"].shape == (4, *CROP)
        out.append((batch["batch"], batch["img"].clone(), batch["meta"]))
    return out


def test_no_workers_matches_the_loader():
    got = collect(dataset())
    ref = zcrop.Loader(zcrop.Source(WORKLOAD, CROP, name="img", dtype="float32"),
                       batch_size=4, seed=5, steps=7)
    assert len(got) == 7
    for (i, img, meta), batch in zip(got, ref):
        np.testing.assert_array_equal(img.numpy(), batch["img"])
        assert meta == batch["meta"]
    assert [i for i, _, _ in got] == list(range(7))


def test_two_workers_give_the_same_stream_without_duplicates_or_losses():
    zero = collect(dataset())
    two = collect(dataset(), num_workers=2)
    assert [i for i, _, _ in two] == list(range(7))
    for (i, a, ma), (j, b, mb) in zip(zero, two):
        assert i == j
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert ma == mb
    seen = [m["global_index"] for _, _, meta in two for m in meta]
    assert sorted(seen) == list(range(7 * 4))


def test_pin_memory_and_len():
    ds = dataset(steps=3)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, pin_memory=True)
    assert len(dl) == 3
    with pytest.warns(UserWarning) if not torch.cuda.is_available() else _nullcontext():
        batches = list(dl)
    assert len(batches) == 3
    if torch.cuda.is_available():
        assert batches[0]["img"].is_pinned()


class _nullcontext:
    def __enter__(self):
        return self

    def __exit__(self, *a):
        return False


def test_resume_at_a_batch():
    full = collect(dataset())
    ds = dataset()
    ds.load_state_dict({"start": 4})
    assert len(ds) == 3
    rest = collect(ds, num_workers=2)
    assert [i for i, _, _ in rest] == [4, 5, 6]
    for (_, a, ma), (_, b, mb) in zip(full[4:], rest):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert ma == mb


def test_state_dict_follows_the_batches_consumed_in_process():
    full = collect(dataset())
    ds = dataset()
    assert ds.state_dict() == {"start": 0}
    for batch in torch.utils.data.DataLoader(ds, batch_size=None):
        if batch["batch"] == 2:
            state = ds.state_dict()
            break
    assert state == {"start": 3}, "saved while holding batch 2: resume after it"
    again = dataset()
    again.load_state_dict(state)
    rest = collect(again)
    assert [i for i, _, _ in rest] == [3, 4, 5, 6]
    for (_, a, ma), (_, b, mb) in zip(full[3:], rest):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
        assert ma == mb
    assert again.state_dict() == {"start": 7}


def test_distributed_ranks_partition_the_samples():
    r0 = collect(dataset(rank=0, world_size=2))
    r1 = collect(dataset(rank=1, world_size=2))
    seen = [m["global_index"] for run in (r0, r1) for _, _, meta in run for m in meta]
    assert sorted(seen) == list(range(7 * 4 * 2))


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
def test_forked_workers_after_using_zcrop_match_one_process():
    ds = dataset(steps=4)
    expected = collect(ds)  # zcrop's threads now run in this process
    got = collect(ds, num_workers=2, multiprocessing_context="fork", timeout=60)
    assert [b for b, _, _ in got] == [b for b, _, _ in expected]
    for (_, x, _), (_, y, _) in zip(got, expected):
        assert torch.equal(x, y)


def test_device_must_be_cuda_and_available():
    with pytest.raises(ValueError, match="CUDA device"):
        dataset(device="cpu")
    if not torch.cuda.is_available():
        with pytest.raises(RuntimeError, match="CUDA is not available"):
            dataset(device="cuda")


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@needs_cuda
def test_device_copies_survive_a_gpu_that_lags_behind():
    # The consumer's stream is kept busy ~10 ms per batch, so every copy is queued long after
    # its batch was handed over; with 2 ring buffers and 1 batch read ahead, each buffer is
    # reused at once when it is freed. Every batch must still arrive as the host stream has it.
    ref = zcrop.Loader(zcrop.Source(WORKLOAD, CROP, name="img", dtype="float32"),
                       batch_size=4, seed=5, steps=7, copy=True, pin=False)
    expected = [b["img"] for b in ref]
    ds = dataset(device="cuda", prefetch=1, buffers=2)
    got = []
    for batch in ds:
        torch.cuda._sleep(20_000_000)
        x = batch["img"]
        assert x.is_cuda and x.dtype == torch.float32
        got.append((batch["batch"], x * 1))  # work on the consumer's stream, after the copy
    torch.cuda.synchronize()
    assert [i for i, _ in got] == list(range(7))
    for (_, x), want in zip(got, expected):
        np.testing.assert_array_equal(x.cpu().numpy(), want)


@needs_cuda
@pytest.mark.parametrize("pin_memory", [False, True])
def test_consumer_copies_survive_a_gpu_that_lags_behind(pin_memory):
    # The consumer copies each batch itself with non_blocking=True and drops the host tensors
    # at once, with its stream kept busy ~10 ms per batch and each ring buffer reused as soon as
    # it is free. The dataset must hold every batch until the stream has run past its copy.
    ref = zcrop.Loader(zcrop.Source(WORKLOAD, CROP, name="img", dtype="float32"),
                       batch_size=4, seed=5, steps=7, copy=True, pin=False)
    expected = [b["img"] for b in ref]
    ds = dataset(prefetch=1, buffers=2)
    dl = torch.utils.data.DataLoader(ds, batch_size=None, pin_memory=pin_memory)
    got = []
    for batch in dl:
        assert batch["img"].is_pinned()
        torch.cuda._sleep(20_000_000)
        got.append(batch["img"].cuda(non_blocking=True))
        del batch
    torch.cuda.synchronize()
    assert len(got) == 7
    for x, want in zip(got, expected):
        np.testing.assert_array_equal(x.cpu().numpy(), want)


@needs_cuda
def test_device_needs_the_main_process():
    dl = torch.utils.data.DataLoader(dataset(device="cuda", steps=2), batch_size=None,
                                     num_workers=1, multiprocessing_context="spawn")
    with pytest.raises(RuntimeError, match="num_workers=0"):
        list(dl)


def test_state_dict_follows_the_consumer_in_this_process():
    ds = dataset(steps=6)
    it = iter(torch.utils.data.DataLoader(ds, batch_size=None))
    for _ in range(3):
        next(it)
    assert ds.state_dict() == {"start": 3}
    resumed = dataset(steps=6)
    resumed.load_state_dict(ds.state_dict())
    assert [b for b, _, _ in collect(resumed)] == [3, 4, 5]


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_stateful_dataloader_resumes_the_stream_exactly(workers):
    sdl = pytest.importorskip("torchdata.stateful_dataloader")

    def loader():
        return sdl.StatefulDataLoader(dataset(steps=9), batch_size=None, num_workers=workers,
                                      timeout=60 if workers else 0)

    full = [(b["batch"], b["img"].clone()) for b in loader()]
    assert [i for i, _ in full] == list(range(9))
    first = loader()
    it = iter(first)
    head = [(b["batch"], b["img"].clone()) for b in (next(it) for _ in range(4))]
    state = first.state_dict()
    del it
    again = loader()
    again.load_state_dict(state)
    tail = [(b["batch"], b["img"].clone()) for b in again]
    assert [i for i, _ in head + tail] == list(range(9))
    for (_, x), (_, y) in zip(head + tail, full):
        assert torch.equal(x, y)


def _rank_stream(rank, world, init, out):
    """One rank of a gloo process group: the global sample indices its dataset yields, taking
    rank and world size from torch.distributed."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world)
    try:
        ds = dataset(steps=3)
        assert (ds.rank, ds.world_size) == (rank, world)
        dl = torch.utils.data.DataLoader(ds, batch_size=None, num_workers=2, timeout=60)
        seen = [m["global_index"] for b in dl for m in b["meta"]]
        torch.save(seen, f"{out}.{rank}")
    finally:
        dist.destroy_process_group()


def test_ranks_come_from_torch_distributed_when_initialised(tmp_path):
    init = f"file://{tmp_path / 'rendezvous'}"
    out = str(tmp_path / "seen")
    torch.multiprocessing.spawn(_rank_stream, args=(2, init, out), nprocs=2, join=True)
    r0, r1 = (torch.load(f"{out}.{r}") for r in (0, 1))
    assert not set(r0) & set(r1)
    assert sorted(r0 + r1) == list(range(3 * 4 * 2))


@pytest.mark.parametrize("workers", [2, 3])
def test_each_ranks_stream_does_not_depend_on_the_number_of_workers(workers):
    for rank in (0, 1):
        alone = collect(dataset(rank=rank, world_size=2))
        split = collect(dataset(rank=rank, world_size=2), num_workers=workers, timeout=60)
        assert [b for b, _, _ in split] == [b for b, _, _ in alone]
        assert [[m["global_index"] for m in meta] for _, _, meta in split] == [
            [m["global_index"] for m in meta] for _, _, meta in alone
        ]
        for (_, x, _), (_, y, _) in zip(split, alone):
            assert torch.equal(x, y)


def test_bfloat16_batches_are_torch_bfloat16_with_and_without_workers():
    pytest.importorskip("ml_dtypes")

    def ds():
        return zt.ZcropDataset(zcrop.Source(WORKLOAD, CROP, name="img", dtype="bfloat16"),
                               batch_size=4, seed=5, steps=3)

    wide = zt.ZcropDataset(zcrop.Source(WORKLOAD, CROP, name="img", dtype="float32"),
                           batch_size=4, seed=5, steps=3)
    expected = [b["img"].to(torch.bfloat16) for b in torch.utils.data.DataLoader(
        wide, batch_size=None)]
    for kw in ({}, {"num_workers": 2, "timeout": 60}):
        got = [b["img"] for b in torch.utils.data.DataLoader(ds(), batch_size=None, **kw)]
        assert all(x.dtype == torch.bfloat16 for x in got)
        assert torch.isfinite(got[0].float().mean())  # ordinary torch ops work
        for x, y in zip(got, expected):
            assert torch.equal(x, y)


class _ViewsOfTheBatch(torch.utils.data.IterableDataset):
    """A worker-side wrapper that yields views of zcrop's tensors, besides the tensors."""

    def __init__(self, ds) -> None:
        self.ds = ds

    def __iter__(self):
        for b in self.ds:
            yield {"img": b["img"], "first": b["img"][:, :1], "batch": b["batch"]}


def test_workers_reuse_their_batch_slots_and_never_overwrite_a_held_batch():
    steps = 24
    zero = [b[1] for b in collect(dataset(steps=steps))]

    def loader(ds=None):
        return torch.utils.data.DataLoader(dataset(steps=steps) if ds is None else ds,
                                           batch_size=None, num_workers=2, timeout=60)

    # A consumer that lets go of each batch: every batch comes through the worker's ring or a
    # reused slot (an ordinary tensor over a mapping the worker made; torch's own way gives
    # shared storage).
    dropped = []
    for b in loader():
        dropped.append((b["img"].is_shared(), b["img"].clone()))
    assert [shared for shared, _ in dropped] == [False] * steps
    for (_, got), want in zip(dropped, zero):
        assert torch.equal(got, want)
    # A consumer that holds every batch: each worker hands over its ring buffers, then its
    # slots, then batches go torch's way, and no held batch is overwritten by a later one.
    held = list(loader(dataset(steps=2 * steps)))
    zero = [b[1] for b in collect(dataset(steps=2 * steps))]
    assert any(b["img"].is_shared() for b in held) and not held[0]["img"].is_shared()
    for b, want in zip(held, zero):
        assert torch.equal(b["img"], want)
    # Views made in the worker are pickled the ordinary way, with the values they saw.
    views = [(b["first"].clone(), b["img"].clone()) for b in loader(_ViewsOfTheBatch(
        dataset(steps=steps)))]
    for (first, img), want in zip(views, zero):
        assert torch.equal(first, want[:, :1]) and torch.equal(img, want)


def test_batch_slots_work_with_the_file_system_sharing_strategy():
    # Training scripts that run out of file descriptors switch torch to "file_system"; the
    # slots then travel as named segments.
    import torch.multiprocessing as tmp

    before = tmp.get_sharing_strategy()
    tmp.set_sharing_strategy("file_system")
    try:
        zero = [b[1] for b in collect(dataset(steps=12))]
        got = [(b["img"].is_shared(), b["img"].clone()) for b in torch.utils.data.DataLoader(
            dataset(steps=12), batch_size=None, num_workers=2, timeout=60)]
    finally:
        tmp.set_sharing_strategy(before)
    assert [shared for shared, _ in got] == [False] * 12
    for (_, x), want in zip(got, zero):
        assert torch.equal(x, want)


def _ring_mappings() -> int:
    with open("/proc/self/maps") as f:
        return sum("zcrop-ring" in line for line in f)


def test_workers_hand_over_their_ring_buffers_without_a_copy():
    zero = [b[1] for b in collect(dataset(steps=12))]
    before = _ring_mappings()
    got = []
    for b in torch.utils.data.DataLoader(dataset(steps=12), batch_size=None, num_workers=2,
                                         timeout=60):
        # The tensor is a view of a worker's ring buffer, mapped here from its memory file.
        got.append((_ring_mappings() > before, b["img"].clone()))
    assert all(mapped for mapped, _ in got)
    for (_, x), want in zip(got, zero):
        assert torch.equal(x, want)


@pytest.mark.parametrize("persistent", [False, True])
def test_the_main_process_forgets_the_carriers_of_past_epochs(persistent):
    zero = [b[1] for b in collect(dataset(steps=8))]
    dl = torch.utils.data.DataLoader(dataset(steps=8), batch_size=None, num_workers=2,
                                     persistent_workers=persistent, timeout=60)
    seen = []
    for _ in range(3):
        got = [b["img"].clone() for b in dl]
        assert len(got) == 8 and all(torch.equal(x, y) for x, y in zip(got, zero))
        seen.append(set(zt._RECEIVED_CARRIERS))
    # Each epoch's workers send their own carriers; those of the first epoch are gone from the
    # map once the third has started (retired at the end of their epoch, every reference in).
    assert seen[0] and seen[2] and not seen[0] & seen[2]
    del dl


def test_a_ring_buffer_goes_back_to_the_loader_once_the_main_process_lets_go():
    import gc
    import pickle
    from multiprocessing.reduction import ForkingPickler

    loader = zcrop.Loader(zcrop.Source(WORKLOAD, CROP, name="img"), batch_size=2, seed=1,
                          prefetch=1, buffers=3, shared_memory=True, pin=False)
    want = [torch.from_numpy(b["img"].copy()) for b in zcrop.Loader(
        zcrop.Source(WORKLOAD, CROP, name="img"), batch_size=2, seed=1, steps=8)]
    ring = zt._RingHandOff(hold=1)

    def put():
        batch, memory = loader._next_with_memory()
        arrays = {"img": batch["img"]}
        return ring.put(batch, arrays, memory), arrays

    first, arrays = put()
    assert first is not None and torch.equal(first["img"], want[0])
    sent = ForkingPickler.dumps(first)
    del first
    got = pickle.loads(sent)  # as the main process does: `got` holds the first ring buffer
    assert torch.equal(got["img"], want[0])
    second, _ = put()
    assert second is None, "more batches kept than `hold`"
    ring.release()
    assert len(ring.kept) == 1, "a buffer went back while the main process holds it"
    # The loader reads on into its other buffers; the kept one is not overwritten.
    for step in range(2, 6):
        batch, memory = loader._next_with_memory()
        assert np.array_equal(batch["img"], want[step].numpy())
        del batch, memory
        assert torch.equal(got["img"], want[0])
    view = got["img"][1:]
    del got
    gc.collect()
    ring.release()
    assert len(ring.kept) == 1, "released while a view of the tensor lives"
    del view, arrays
    gc.collect()
    ring.release()
    assert ring.kept == []
    loader.close()


def test_counter_add_counts_atomically_in_a_writable_int64_array():
    from zcrop._zcrop import counter_add

    words = np.zeros(2, dtype=np.int64)
    assert counter_add(words, 1, 3) == 3
    assert counter_add(words, 1, 0) == 3
    assert counter_add(words, 0, -2) == -2
    assert words.tolist() == [-2, 3]
    with pytest.raises(IndexError, match="counter 2 of 2"):
        counter_add(words, 2, 1)
    words.flags.writeable = False
    with pytest.raises(ValueError, match="writable"):
        counter_add(words, 0, 1)
    with pytest.raises(ValueError, match="contiguous"):
        counter_add(np.zeros(4, dtype=np.int64)[::2], 0, 1)
    with pytest.raises(TypeError):
        counter_add(np.zeros(2, dtype=np.int32), 0, 1)


def test_a_worker_slot_is_reused_once_the_main_process_lets_go():
    import gc
    import pickle
    from multiprocessing.reduction import ForkingPickler

    arrays = {"x": np.arange(1000, dtype=np.float32)}
    want = torch.arange(1000, dtype=torch.float32)
    pool = zt._SlotPool(max_slots=2)
    # Freed memory of the slot's size, dirty: a new slot's counts must not start from it.
    dirty = torch.full((zt._SLOT_HEADER + 4000,), 255, dtype=torch.uint8)
    del dirty
    first = pool.put(arrays)
    assert zt._slot_counters(pool.slots[0][1]).tolist() == [0, 0, 0, 0]
    sent = ForkingPickler.dumps(first)
    del first
    got = pickle.loads(sent)  # as the main process does; `got` holds slot 0
    assert torch.equal(got["x"], want) and not got["x"].is_shared()
    second = pool.put(arrays)
    assert len(pool.slots) == 2 and second["x"]._zcrop_slot[0] is pool.slots[1][0]
    assert pool.put(arrays) is None  # slot 0 held by the main process, slot 1 by the worker
    view = got["x"][10:]
    del got
    gc.collect()
    assert pool.put(arrays) is None, "slot 0 was freed while a view of its tensor lives"
    assert torch.equal(view, want[10:])
    del view
    third = pool.put(arrays)
    assert third is not None and third["x"]._zcrop_slot[0] is pool.slots[0][0]
    assert torch.equal(third["x"], want)


def test_a_carrier_is_sent_once_then_by_its_key_and_forgotten_once_retired():
    import pickle
    from multiprocessing.reduction import ForkingPickler

    from zcrop._zcrop import counter_add

    pool = zt._SlotPool(max_slots=1)
    arrays = {"x": np.arange(1000, dtype=np.float32)}
    first = ForkingPickler.dumps(pool.put(arrays))
    key = pool.slots[0][0]._zcrop_key
    assert key not in zt._RECEIVED_CARRIERS
    got = pickle.loads(first)  # as the main process does: the shared memory itself came
    assert key in zt._RECEIVED_CARRIERS
    del got
    second = ForkingPickler.dumps(pool.put(arrays))
    assert len(second) < len(first)  # the key alone
    got = pickle.loads(second)  # resolved by key, in this process's map
    assert torch.equal(got["x"], torch.arange(1000, dtype=torch.float32))
    del got
    counters = zt._slot_counters(pool.slots[0][1])
    assert counters[zt._SENT] == 2 and counters[zt._RECEIVED] == 2
    zt._forget_retired_carriers()
    assert key in zt._RECEIVED_CARRIERS  # not retired
    third = ForkingPickler.dumps(pool.put(arrays))  # sent, not received yet
    pool.retire()
    zt._forget_retired_carriers()
    assert key in zt._RECEIVED_CARRIERS, "forgotten while a reference is on its way"
    got = pickle.loads(third)
    del got
    zt._forget_retired_carriers()
    assert key not in zt._RECEIVED_CARRIERS
    with pytest.raises(RuntimeError, match="never received"):
        pickle.loads(second)
    assert counter_add(counters, zt._RETIRED, 0) == 1


def test_a_slot_tensor_whose_storage_moved_pickles_the_ordinary_way():
    import pickle
    from multiprocessing.reduction import ForkingPickler

    pool = zt._SlotPool(max_slots=1)
    out = pool.put({"x": np.arange(1000, dtype=np.float32)})
    out["x"].share_memory_()  # moves its storage out of the slot (torch copies it)
    got = pickle.loads(ForkingPickler.dumps(out))
    assert got["x"].is_shared() and torch.equal(got["x"], torch.arange(1000, dtype=torch.float32))
    assert zt._slot_counters(pool.slots[0][1]).tolist() == [0] * 4  # nothing sent from the slot


def test_batches_with_time_labels_pass_through_the_dataloader(tmp_path):
    """torch's default_convert (DataLoader(batch_size=None)) made tensors of numpy values in
    the metadata and failed on datetime64 labels; BatchMeta passes through it unchanged."""
    import pandas as pd
    import xarray as xr

    times = pd.date_range("2024-01-01", periods=12, freq="h")
    values = np.arange(12 * 8 * 8, dtype=np.float32).reshape(12, 8, 8)
    xr.Dataset({"t2m": (("time", "y", "x"), values)}, coords={"time": times}).to_zarr(
        tmp_path / "d.zarr", zarr_format=3)
    ds = zcrop.open_dataset(tmp_path / "d.zarr")
    src = zcrop.Source(ds["t2m"], crop={"time": 2, "y": 4, "x": 4})
    want = list(zcrop.Loader(src, batch_size=3, seed=2, steps=4, copy=True))
    for workers in (0, 2):
        dl = torch.utils.data.DataLoader(zt.ZcropDataset(src, batch_size=3, seed=2, steps=4),
                                         batch_size=None, num_workers=workers,
                                         timeout=60 if workers else 0)
        got = [{"meta": b["meta"], "t2m": b["t2m"].clone()} for b in dl]
        assert len(got) == 4
        for b, w in zip(got, want):
            assert isinstance(b["meta"], zt.BatchMeta) and len(b["meta"]) == 3
            for m, wm in zip(b["meta"], w["meta"]):
                labels = m["sources"]["t2m"]["labels"]
                assert labels.keys() == wm["sources"]["t2m"]["labels"].keys() == {"time"}
                for name, v in labels.items():
                    np.testing.assert_array_equal(v, wm["sources"]["t2m"]["labels"][name])
                assert m["position"] == wm["position"]
            assert b["meta"].tolist()[0] is b["meta"][0]
            np.testing.assert_array_equal(b["t2m"].numpy(), w["t2m"])
        assert got[0]["meta"][0]["sources"]["t2m"]["labels"]["time"].dtype.kind == "M"


def test_batch_meta_reads_like_the_loaders_list():
    samples = [{"step": 0, "index": i} for i in range(3)]
    meta = zt.BatchMeta(samples)
    assert meta == samples and meta == zt.BatchMeta(samples) and meta != samples[:2]
    assert len(meta) == 3 and meta[1] == {"step": 0, "index": 1} and meta[1:] == samples[1:]
    assert [m["index"] for m in meta] == [0, 1, 2]
    assert meta.tolist() == samples and meta.tolist() is not samples
    assert repr(meta).startswith("BatchMeta([{")
    import pickle

    assert pickle.loads(pickle.dumps(meta)) == samples
    from torch.utils.data._utils.collate import default_convert

    assert default_convert({"meta": meta})["meta"] is meta
