import pytest

from specasr.cache import atomic_directory


def test_completed_block_publishes_the_folder(tmp_path):
    final = tmp_path / "result"
    with atomic_directory(final) as scratch:
        (scratch / "weights").write_text("done")
    assert (final / "weights").read_text() == "done"
    assert [p.name for p in tmp_path.iterdir()] == ["result"]


def test_interrupted_block_leaves_nothing_behind(tmp_path):
    final = tmp_path / "result"
    with pytest.raises(KeyboardInterrupt), atomic_directory(final) as scratch:
        (scratch / "weights").write_text("half")
        raise KeyboardInterrupt
    assert list(tmp_path.iterdir()) == []


def test_interrupted_rebuild_keeps_the_previous_result(tmp_path):
    final = tmp_path / "result"
    with atomic_directory(final) as scratch:
        (scratch / "weights").write_text("old")
    with pytest.raises(RuntimeError), atomic_directory(final) as scratch:
        raise RuntimeError("killed")
    assert (final / "weights").read_text() == "old"


def test_completed_rebuild_replaces_the_previous_result(tmp_path):
    final = tmp_path / "result"
    for content in ("epoch 1", "epoch 2"):
        with atomic_directory(final) as scratch:
            (scratch / "weights").write_text(content)
    assert (final / "weights").read_text() == "epoch 2"
    assert [p.name for p in tmp_path.iterdir()] == ["result"]
