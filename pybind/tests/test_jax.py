"""zcrop.jax with real jax (CPU): arrays equal the loader's, sharding follows the process
index and count, host memory is aliased without a copy and stays valid."""

from __future__ import annotations

import gc

import jax
import numpy as np
import pytest

import zcrop
import zcrop.jax as zj
from conftest import FIXTURES

WORKLOAD = str(FIXTURES / "data/v3_workload_4d_u2.zarr")
CROP = (2, 3, 16, 16)


def source():
    return zcrop.Source(WORKLOAD, CROP, name="img", dtype="float32")


def test_jax_batches_equal_the_loader():
    it = zj.JaxLoader(source(), batch_size=3, seed=2, steps=4)
    assert (it.rank, it.world_size) == (jax.process_index(), jax.process_count()) == (0, 1)
    ref = zcrop.Loader(source(), batch_size=3, seed=2, steps=4)
    n = 0
    for got, want in zip(it, ref):
        assert isinstance(got["img"], jax.Array)
        assert got["img"].dtype == np.float32 and got["img"].shape == (3, *CROP)
        np.testing.assert_array_equal(np.asarray(got["img"]), want["img"])
        assert got["meta"] == want["meta"]
        n += 1
    assert n == 4 == len(it)


def test_sharding_by_process():
    whole = [b["img"] for b in zj.JaxLoader(source(), batch_size=4, seed=2, steps=3, rank=0, world_size=1)]
    parts = [
        [b["img"] for b in zj.JaxLoader(source(), batch_size=2, seed=2, steps=3, rank=r, world_size=2)]
        for r in range(2)
    ]
    for w, a, b in zip(whole, *parts):
        np.testing.assert_array_equal(np.asarray(w), np.concatenate([np.asarray(a), np.asarray(b)]))


def test_arrays_alias_the_batch_and_keep_it_alive():
    ld = zcrop.Loader(source(), batch_size=2, seed=2, steps=8, prefetch=1)
    batch = next(ld)
    host = batch["img"]
    arr = zj.to_jax(host)
    if jax.default_backend() == "cpu":
        assert arr.unsafe_buffer_pointer() == host.ctypes.data  # no copy
    expected = host.copy()
    del batch, host
    gc.collect()
    for _ in range(5):  # later batches cannot reuse the buffer `arr` aliases
        next(ld)
    np.testing.assert_array_equal(np.asarray(arr), expected)


def test_resume():
    # np.array copies: a jax array aliasing a batch keeps its ring buffer (see the lifetime rule).
    full = [np.array(b["img"]) for b in zj.JaxLoader(source(), batch_size=2, seed=9, steps=5)]
    it = zj.JaxLoader(source(), batch_size=2, seed=9, steps=5)
    next(it)
    next(it)
    state = it.state_dict()
    again = zj.JaxLoader(source(), batch_size=2, seed=9, steps=5)
    again.load_state_dict(state)
    rest = [np.array(b["img"]) for b in again]
    assert len(rest) == 3
    for a, b in zip(full[2:], rest):
        np.testing.assert_array_equal(a, b)


@pytest.mark.skipif(jax.default_backend() == "cpu", reason="needs jax on an accelerator")
def test_device_batches_can_all_be_kept_with_the_fewest_buffers():
    # On an accelerator jax copies each batch and holds its ring buffer until its next transfer;
    # with 2 buffers and 1 batch read ahead, the loader must still never find them all held.
    ref = zcrop.Loader(source(), batch_size=4, seed=5, steps=30, copy=True, pin=False)
    want = [b["img"] for b in ref]
    it = zj.JaxLoader(source(), batch_size=4, seed=5, steps=30, prefetch=1, buffers=2)
    got = [b["img"] for b in it]
    assert got[0].devices() == {jax.devices()[0]}
    assert len(got) == 30
    for g, w in zip(got, want):
        np.testing.assert_array_equal(np.asarray(g), w)
