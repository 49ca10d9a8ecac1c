"""zcrop.open_icechunk on the fixture repositories written by icechunk 1.1.21 (spec v1) and
2.3.0 (spec v2): values at the branch tip, at a tag and by snapshot id, locally and from an
S3 server; bad arguments and missing nodes."""

from __future__ import annotations

import pathlib

import numpy as np
import pytest

import zcrop

REPOS = pathlib.Path(__file__).resolve().parents[2] / "fixtures" / "icechunk-repos"


def expected_big(tip: bool) -> np.ndarray:
    x = np.arange(200, dtype="float32").reshape(10, 20)
    if tip:
        x[:5, :10] = -1
    return x


@pytest.mark.parametrize("spec", ["v1", "v2"])
def test_snapshots_read_as_written(spec):
    tip = zcrop.open_icechunk(REPOS / spec)
    first = zcrop.open_icechunk(REPOS / spec, tag="v1")
    assert tip.snapshot_id != first.snapshot_id
    again = zcrop.open_icechunk(REPOS / spec, snapshot=first.snapshot_id)
    assert again.snapshot_id == first.snapshot_id
    assert tip.arrays() == ["/grp/big", "/grp/raw", "/grp/sharded", "/small"]
    np.testing.assert_array_equal(tip["grp/big"][:], expected_big(True))
    np.testing.assert_array_equal(first["/grp/big"][:], expected_big(False))
    np.testing.assert_array_equal(tip["grp/big"][3:7, 8:12], expected_big(True)[3:7, 8:12])
    np.testing.assert_array_equal(tip["grp/raw"][150:250], np.arange(150, 250, dtype="int32"))
    np.testing.assert_array_equal(tip["small"][:], [1, 2, 3, 4])
    assert "grp/big" in repr(tip.arrays()) and "IcechunkSnapshot" in repr(tip)


def test_from_an_s3_server(s3):
    s3.upload_tree("icechunk-py", REPOS / "v1", "repo")
    snap = zcrop.open_icechunk("s3://icechunk-py/repo", tag="v1", storage_options=s3.options)
    np.testing.assert_array_equal(snap["grp/big"][:], expected_big(False))


def test_bad_arguments_and_missing_nodes(tmp_path):
    with pytest.raises(ValueError, match="at most one"):
        zcrop.open_icechunk(REPOS / "v2", branch="main", tag="v1")
    with pytest.raises(zcrop.InvalidArgumentError, match="no branch"):
        zcrop.open_icechunk(REPOS / "v2", branch="nope")
    with pytest.raises(zcrop.NodeNotFoundError):
        zcrop.open_icechunk(tmp_path)
    with pytest.raises(zcrop.NodeNotFoundError):
        zcrop.open_icechunk(REPOS / "v2")["grp/nope"]
