"""zcrop.Samples: random access to the loader's sample stream, as a torch map-style dataset
and a Grain data source. Sample i equals the Loader's global sample i and the array's crop at
its origin; the framework's own samplers, workers and checkpoints drive it."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
import torch.utils.data
import zarr

import zcrop
from conftest import FIXTURES

WORKLOAD = str(FIXTURES / "data/v3_workload_4d_u2.zarr")  # (6, 3, 70, 90) uint16
CROP = (2, 3, 16, 16)


@pytest.fixture(scope="module")
def data():
    return zarr.open_array(WORKLOAD, mode="r")[...]


def source(**kw):
    return zcrop.Source(WORKLOAD, CROP, name="img", **kw)


def samples(**kw):
    kw.setdefault("seed", 11)
    kw.setdefault("length", 40)
    return zcrop.Samples(source(), **kw)


def crop_at(data, origin, shape):
    return data[tuple(slice(o, o + s) for o, s in zip(origin, shape))]


def test_sample_i_is_the_loaders_global_sample_i_and_the_crop_at_its_origin(data):
    s = samples()
    assert len(s) == 40
    with zcrop.Loader(source(), batch_size=4, seed=11, steps=10, copy=True) as ld:
        batches = list(ld)
    for i in range(40):
        x = s[i]
        batch = batches[i // 4]
        np.testing.assert_array_equal(x["img"], batch["img"][i % 4])
        origin = batch["meta"][i % 4]["sources"]["img"]["origin"]
        np.testing.assert_array_equal(x["meta"]["origin"]["img"], origin)
        assert x["meta"]["index"] == i
        np.testing.assert_array_equal(x["img"], crop_at(data, origin, CROP))
        assert x["img"].flags.writeable and x["img"].flags.aligned
    np.testing.assert_array_equal(s[-1]["img"], s[39]["img"])


def test_epoch_mode_covers_the_lattice_once_and_has_its_length():
    s = zcrop.Samples(source(), seed=3, mode="epoch", stride=[2, 1, 16, 16])
    positions = {tuple(s[i]["meta"]["position"]) for i in range(len(s))}
    assert len(positions) == len(s) > 1
    assert all(s[i]["meta"]["epoch"] == 0 for i in range(len(s)))


def test_transforms_and_dtype_apply_as_in_the_loader():
    kw = {"dtype": "float32", "normalize": (1, [10.0, 20.0, 30.0], [2.0, 4.0, 8.0])}
    s = zcrop.Samples(zcrop.Source(WORKLOAD, CROP, name="img", **kw), seed=2, length=8)
    with zcrop.Loader(zcrop.Source(WORKLOAD, CROP, name="img", **kw), batch_size=8, seed=2,
                      steps=1, copy=True) as ld:
        (batch,) = list(ld)
    for i in range(8):
        assert s[i]["img"].dtype == np.float32
        np.testing.assert_array_equal(s[i]["img"], batch["img"][i])


def test_bad_arguments_are_clear():
    with pytest.raises(ValueError, match="length="):
        zcrop.Samples(source(), seed=1)
    s = samples(length=3)
    with pytest.raises(IndexError, match="out of range"):
        s[3]
    with pytest.raises(IndexError):
        s[-4]
    with pytest.raises(TypeError, match="integers"):
        s["0"]
    with pytest.raises(ValueError, match="negative"):
        samples(length=-1)


def test_pickles_by_its_arguments_and_reprs_its_identity():
    s = samples()
    again = pickle.loads(pickle.dumps(s))
    assert repr(again) == repr(s)
    assert WORKLOAD in repr(s) and "seed=11" in repr(s) and "length=40" in repr(s)
    np.testing.assert_array_equal(again[7]["img"], s[7]["img"])
    assert repr(samples(seed=12)) != repr(s)


def test_reads_from_many_threads_at_once_are_deterministic():
    from concurrent.futures import ThreadPoolExecutor

    s = samples()
    expected = [s[i]["img"] for i in range(40)]
    with ThreadPoolExecutor(8) as pool:
        got = list(pool.map(lambda i: s[i]["img"], list(range(40)) * 3))
    for k, x in enumerate(got):
        np.testing.assert_array_equal(x, expected[k % 40])


@pytest.mark.parametrize("context", [None, "fork", "spawn"])
def test_torch_map_style_with_its_own_sampler_and_collate(context):
    s = samples()
    g = torch.Generator().manual_seed(0)
    order = torch.randperm(40, generator=g).tolist()
    kw = {} if context is None else {"num_workers": 2, "multiprocessing_context": context,
                                     "timeout": 60}
    dl = torch.utils.data.DataLoader(s, batch_size=8, sampler=order, **kw)
    seen = []
    for batch in dl:
        assert batch["img"].shape == (8, *CROP)
        for x, i in zip(batch["img"], batch["meta"]["index"].tolist()):
            assert torch.equal(x, torch.from_numpy(s[i]["img"].astype(np.int32)).to(x.dtype))
            seen.append(i)
    assert seen == order


grain = pytest.importorskip("grain")


def test_grain_map_dataset_shuffles_and_batches_deterministically():
    s = samples()
    ds = grain.MapDataset.source(s).shuffle(seed=5).batch(8)
    first = [b["meta"]["index"].tolist() for b in ds]
    again = [b["meta"]["index"].tolist() for b in grain.MapDataset.source(s).shuffle(seed=5).batch(8)]
    assert first == again
    assert sorted(i for b in first for i in b) == list(range(40))
    b = ds[0]
    for x, i in zip(b["img"], b["meta"]["index"]):
        np.testing.assert_array_equal(x, s[int(i)]["img"])


@pytest.mark.parametrize("workers", [0, 2])
def test_grain_dataloader_with_index_sampler_checkpoints_and_resumes(workers):
    from absl import flags

    flags.FLAGS.mark_as_parsed()  # Grain's worker processes read absl flags (no absl.app here)
    s = samples()

    def loader():
        return grain.DataLoader(
            data_source=s,
            sampler=grain.samplers.IndexSampler(
                num_records=len(s), shuffle=True, seed=9, num_epochs=1,
                shard_options=grain.sharding.NoSharding(),
            ),
            operations=[grain.transforms.Batch(batch_size=4)],
            worker_count=workers,
        )

    full = [b["meta"]["index"].tolist() for b in loader()]
    assert sorted(i for b in full for i in b) == list(range(40))
    it = iter(loader())
    head = [next(it)["meta"]["index"].tolist() for _ in range(3)]
    state = it.get_state()
    resumed = iter(loader())
    resumed.set_state(state)
    tail = [b["meta"]["index"].tolist() for b in resumed]
    assert head + tail == full
