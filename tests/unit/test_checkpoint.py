import numpy as np
import pytest

from memcl.pipeline import checkpoint


def _parts(value):
    return {"memory": {"w": np.full((3, 2), value, np.float32), "name": np.array("slots")},
            "stage2": {"learned": np.arange(value, dtype=np.int64)}}


def test_roundtrip_and_retention(tmp_path):
    for seq in range(4):
        checkpoint.write(tmp_path, seq, _parts(seq + 1), {"next_visit": seq + 1})
    assert len(list(tmp_path.glob("ckpt-*.npz"))) == 2  # keeps the newest two
    path, parts, meta = checkpoint.latest_valid(tmp_path)
    assert path.name == "ckpt-000003.npz" and meta == {"next_visit": 4}
    np.testing.assert_array_equal(parts["memory"]["w"], np.full((3, 2), 4, np.float32))
    assert str(parts["memory"]["name"]) == "slots" and parts["stage2"]["learned"].tolist() == [0, 1, 2, 3]
    assert not list(tmp_path.glob(".*tmp*"))


@pytest.mark.parametrize("damage", ["truncate", "flip", "no_checksum"])
def test_corrupt_checkpoint_is_refused_and_the_previous_one_used(tmp_path, damage):
    checkpoint.write(tmp_path, 0, _parts(1), {"next_visit": 1})
    newest = checkpoint.write(tmp_path, 1, _parts(2), {"next_visit": 2})
    data = newest.read_bytes()
    if damage == "truncate":
        newest.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        newest.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    else:
        newest.with_suffix(".sha256").unlink()
    expected = "no checksum file" if damage == "no_checksum" else "checksum mismatch"
    with pytest.raises(checkpoint.CheckpointError, match=expected):
        checkpoint.read(newest)
    with pytest.warns(UserWarning, match="skipping bad checkpoint"):
        path, _, meta = checkpoint.latest_valid(tmp_path)
    assert path.name == "ckpt-000000.npz" and meta["next_visit"] == 1


def test_no_checkpoint_at_all(tmp_path):
    assert checkpoint.latest_valid(tmp_path) is None
    with pytest.raises(checkpoint.CheckpointError, match="no such checkpoint"):
        checkpoint.read(tmp_path / "ckpt-000000.npz")
