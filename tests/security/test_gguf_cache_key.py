"""The converted-GGUF cache (engine/models/gguf_cache.py) keys each converted copy by the
GGUF's content, so a look-alike file (same name, size and modification time, other
weights) never gets another model's copy; and it reads a converted copy only when no other
user could have written it (kernels/private_cache.py).

The GGUF files are tiny ones written with the `gguf` package; `save` stands in for
loader.save_checkpoint and writes which model it saw.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import numpy as np
import pytest
from gguf import GGUFWriter

from engine.models import gguf_cache

MTIME_NS = 1_700_000_000_123_456_789


def write_gguf(path: Path, seed: int) -> Path:
    """A GGUF of two float32 tensors drawn from `seed`: the same header, tensor index and
    size for every seed; only the weights differ. Its mtime is MTIME_NS."""
    path.parent.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    writer = GGUFWriter(str(path), "llama")
    writer.add_tensor("token_embd.weight", rng.standard_normal((8, 4), dtype=np.float32))
    writer.add_tensor("output_norm.weight", rng.standard_normal(4, dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.utime(path, ns=(MTIME_NS, MTIME_NS))
    return path


def saver(label: str):
    return lambda out: (out / "weights.txt").write_text(label)


@pytest.fixture
def cache_root(monkeypatch, tmp_path):
    monkeypatch.setenv("BATCHPILOT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("BATCHPILOT_GGUF_CACHE", "1")
    return tmp_path / "cache" / "gguf"


def test_look_alike_files_get_their_own_converted_copy(tmp_path, cache_root):
    first = write_gguf(tmp_path / "a" / "model.gguf", 1)
    second = write_gguf(tmp_path / "b" / "model.gguf", 2)
    a, b = first.stat(), second.stat()
    assert (a.st_size, a.st_mtime_ns) == (b.st_size, b.st_mtime_ns)
    assert first.read_bytes() != second.read_bytes()
    gguf_cache.store(first, saver("first"))
    gguf_cache.store(second, saver("second"))
    assert gguf_cache.converted_dir(first) != gguf_cache.converted_dir(second)
    assert (gguf_cache.lookup(first) / "weights.txt").read_text() == "first"
    assert (gguf_cache.lookup(second) / "weights.txt").read_text() == "second"
    copy = write_gguf(tmp_path / "c" / "renamed.gguf", 1)  # the bytes of `first`
    digest = gguf_cache.converted_dir(first).name.rsplit("-", 1)[1]
    assert gguf_cache.converted_dir(copy).name.rsplit("-", 1)[1] == digest


def test_converted_copy_is_private(tmp_path, cache_root):
    gguf = write_gguf(tmp_path / "model.gguf", 1)
    gguf_cache.store(gguf, saver("ours"))
    converted = gguf_cache.lookup(gguf)
    assert converted is not None and converted.parent == cache_root
    for path in (cache_root, converted):
        assert stat.S_IMODE(path.stat().st_mode) == 0o700
    assert {stat.S_IMODE(p.stat().st_mode) for p in converted.iterdir()} == {0o600}


def loosen(converted: Path, where: str) -> Path:
    """Make one part of a converted copy writable by others; returns that part."""
    path = {"gguf dir": converted.parent, "converted dir": converted,
            "weights file": converted / "weights.txt"}[where]
    path.chmod(stat.S_IMODE(path.stat().st_mode) | 0o022)
    return path


@pytest.mark.parametrize("where", ["gguf dir", "converted dir", "weights file"])
def test_writable_converted_copy_is_not_used(tmp_path, cache_root, caplog, where):
    gguf = write_gguf(tmp_path / "model.gguf", 1)
    gguf_cache.store(gguf, saver("tampered"))
    loosened = loosen(gguf_cache.lookup(gguf), where)
    with caplog.at_level(logging.WARNING, logger=gguf_cache.__name__):
        assert gguf_cache.lookup(gguf) is None  # the loader reads the GGUF instead
    assert str(loosened) in caplog.text and "writable by group or others" in caplog.text
    if where != "gguf dir":  # store() replaces a refused copy; a refused gguf/ it leaves
        gguf_cache.store(gguf, saver("fresh"))
        assert (gguf_cache.lookup(gguf) / "weights.txt").read_text() == "fresh"


def test_converted_copy_of_another_user_is_not_used(monkeypatch, tmp_path, cache_root, caplog):
    gguf = write_gguf(tmp_path / "model.gguf", 1)
    gguf_cache.store(gguf, saver("theirs"))
    converted = gguf_cache.lookup(gguf)
    owner = converted.stat().st_uid
    monkeypatch.setattr(os, "getuid", lambda: owner + 1)
    with caplog.at_level(logging.WARNING, logger=gguf_cache.__name__):
        assert gguf_cache.lookup(gguf) is None
    assert f"owned by uid {owner}, not by this user" in caplog.text


def test_a_writable_folder_inside_a_converted_copy_is_not_used(tmp_path, cache_root, caplog):
    """A folder inside the converted copy that others may write (they could add or swap
    the files in it) refuses the copy, as a writable file in it does."""
    gguf = write_gguf(tmp_path / "model.gguf", 1)

    def save(out: Path) -> None:
        (out / "shards").mkdir()
        (out / "shards" / "weights.txt").write_text("ours")

    gguf_cache.store(gguf, save)
    shards = gguf_cache.lookup(gguf) / "shards"
    shards.chmod(0o777)
    with caplog.at_level(logging.WARNING, logger=gguf_cache.__name__):
        assert gguf_cache.lookup(gguf) is None
    assert str(shards) in caplog.text and "writable by group or others" in caplog.text


def test_a_converted_copy_without_its_completion_marker_is_not_used(tmp_path, cache_root):
    """A directory whose save never finished (no .complete) would load as a broken model:
    the loader reads the GGUF instead, and the next store() replaces it."""
    gguf = write_gguf(tmp_path / "model.gguf", 1)
    gguf_cache.store(gguf, saver("half"))
    (gguf_cache.lookup(gguf) / ".complete").unlink()
    assert gguf_cache.lookup(gguf) is None
    gguf_cache.store(gguf, saver("whole"))
    assert (gguf_cache.lookup(gguf) / "weights.txt").read_text() == "whole"


def test_cache_switched_off_writes_nothing(monkeypatch, tmp_path, cache_root):
    """BATCHPILOT_GGUF_CACHE=0: no converted copy is read, and none is written to disk."""
    monkeypatch.setenv("BATCHPILOT_GGUF_CACHE", "0")
    gguf = write_gguf(tmp_path / "model.gguf", 1)
    gguf_cache.store(gguf, saver("unwanted"))
    assert not cache_root.exists()
    assert gguf_cache.lookup(gguf) is None


def test_a_file_rewritten_in_place_is_hashed_again(tmp_path, cache_root):
    """Other weights written over the same path, with the same size and mtime put back
    (a copy that keeps timestamps), must not get the old file's converted copy: the
    in-process hash memo is keyed by the ctime too, which no user can set."""
    gguf = write_gguf(tmp_path / "model.gguf", 1)
    before = gguf_cache.converted_dir(gguf)
    write_gguf(gguf, 2)
    assert gguf_cache.converted_dir(gguf) != before
