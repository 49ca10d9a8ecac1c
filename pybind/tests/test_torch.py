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
    if dl_kwargs.get("num_workers", 0) > 0:
        # zcrop's threads are running in this (pytest) process; forked workers would inherit
        # none of them, so workers start from a fork server.
        dl_kwargs.setdefault("multiprocessing_context", "forkserver")
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


def test_distributed_ranks_partition_the_samples():
    r0 = collect(dataset(rank=0, world_size=2))
    r1 = collect(dataset(rank=1, world_size=2))
    seen = [m["global_index"] for run in (r0, r1) for _, _, meta in run for m in meta]
    assert sorted(seen) == list(range(7 * 4 * 2))


@pytest.mark.filterwarnings("ignore:os.fork:RuntimeWarning")
def test_forked_workers_after_using_zcrop_fail_clearly_instead_of_hanging():
    dl = torch.utils.data.DataLoader(dataset(steps=2), batch_size=None, num_workers=1,
                                     multiprocessing_context="fork", timeout=60)
    with pytest.raises(RuntimeError, match="forkserver"):
        list(dl)
