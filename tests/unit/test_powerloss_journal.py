"""The lost-fsync journal on its own (no FUSE): what a power cut takes back and what it
keeps, for file data, sizes and directory entries, in each drop mode."""
from __future__ import annotations

import os

import pytest

from chaos.powerloss.journal import Journal


@pytest.fixture
def j(tmp_path):
    (tmp_path / "disk").mkdir()
    journal = Journal(str(tmp_path / "disk"), str(tmp_path / "stash"))
    yield journal
    journal.close()


def read(j: Journal, name: str) -> bytes:
    with open(j.real(name), "rb") as f:
        return f.read()


def made(j: Journal, name: str, data: bytes = b"") -> int:
    """A file created, written and made durable (data and entry)."""
    fid = j.create(name, 0o644)
    if data:
        j.write(fid, 0, data)
    j.fsync(fid)
    j.fsyncdir(os.path.dirname(name))
    return fid


def test_an_unsynced_write_is_gone_after_the_cut(j):
    fid = made(j, "f", b"durable")
    j.write(fid, 7, b"+lost")
    j.write(fid, 0, b"D")
    assert read(j, "f") == b"Durable+lost"  # what every process sees before the cut
    dropped = j.drop()
    assert read(j, "f") == b"durable"
    assert (dropped.writes, dropped.bytes, dropped.files) == (2, 6, ["f"])


def test_an_fsynced_write_is_kept(j):
    fid = made(j, "f", b"one")
    j.write(fid, 3, b"two")
    j.fsync(fid)
    j.write(fid, 6, b"three")
    j.drop()
    assert read(j, "f") == b"onetwo"
    assert j.pending() == {"writes": 0, "bytes": 0, "entries": 0}


def test_fsync_covers_only_its_own_file(j):
    a, b = made(j, "a", b"a"), made(j, "b", b"b")
    j.write(a, 1, b"A")
    j.write(b, 1, b"B")
    j.fsync(a)
    j.drop()
    assert (read(j, "a"), read(j, "b")) == (b"aA", b"b")


def test_a_truncation_not_synced_is_undone(j):
    fid = made(j, "f", b"0123456789")
    j.truncate(fid, 4)
    j.write(fid, 4, b"xy")
    assert read(j, "f") == b"0123xy"
    j.drop()
    assert read(j, "f") == b"0123456789"


def test_a_created_file_neither_it_nor_its_directory_synced_is_gone(j):
    fid = j.create("new", 0o644)
    j.write(fid, 0, b"data")
    dropped = j.drop()
    assert not os.path.exists(j.real("new"))
    assert (dropped.entries, dropped.writes) == (1, 1)


def test_a_file_s_fsync_keeps_its_creation_and_the_unlink_of_the_name_before(j):
    made(j, "log", b"old log")
    j.unlink("log")
    fid = j.create("log", 0o644)  # the same name, a new file
    j.write(fid, 0, b"new")
    j.fsync(fid)  # as on ext4: its entry is durable with it, so the unlink before it is
    j.drop()
    assert read(j, "log") == b"new"


def test_an_unlink_not_synced_is_undone_with_the_file_as_it_was(j):
    fid = made(j, "journal", b"hot")
    j.write(fid, 3, b"!")  # unsynced, so lost with the cut
    j.unlink("journal")
    assert not os.path.exists(j.real("journal"))
    j.drop()
    assert read(j, "journal") == b"hot"


def test_a_synced_unlink_stays(j):
    made(j, "gone", b"x")
    j.unlink("gone")
    j.fsyncdir("")
    j.drop()
    assert not os.path.exists(j.real("gone"))


def test_a_rename_not_synced_is_undone_and_the_replaced_file_comes_back(j):
    made(j, "target", b"old")
    made(j, "tmp", b"new")
    j.rename("tmp", "target")
    assert read(j, "target") == b"new"
    j.drop()
    assert (read(j, "target"), read(j, "tmp")) == (b"old", b"new")


def test_a_synced_rename_stays_and_writes_follow_the_file(j):
    fid = made(j, "tmp", b"a")
    j.rename("tmp", "final")
    j.fsyncdir("")
    j.write(fid, 1, b"b")
    j.fsync(fid)
    j.drop()
    assert read(j, "final") == b"ab" and not os.path.exists(j.real("tmp"))


def test_torn_seq_keeps_a_seeded_subset_of_the_unsynced_writes(j):
    fid = made(j, "f", b"." * 40)
    for n in range(40):
        j.write(fid, n, b"x")
    dropped = j.drop("torn-seq", seed=7)
    kept = read(j, "f")
    assert 0 < kept.count(b"x") < 40  # some, not all
    assert dropped.kept_writes == kept.count(b"x") and dropped.writes == 40 - dropped.kept_writes
    # the same seed keeps the same writes
    again = made(j, "g", b"." * 40)
    for n in range(40):
        j.write(again, n, b"x")
    j.drop("torn-seq", seed=7)
    assert read(j, "g") == kept


def test_torn_op_keeps_part_of_one_write(j):
    fid = made(j, "f", b"\0" * 4096)
    j.write(fid, 0, b"a" * 4096)
    dropped = j.drop("torn-op", seed=3)
    data = read(j, "f")
    assert 0 < data.count(b"a") < 4096 and data.count(b"a") % 512 == 0
    assert dropped.torn_bytes_kept == data.count(b"a")
    assert dropped.bytes == 4096 - dropped.torn_bytes_kept


def test_an_unknown_mode_is_refused(j):
    with pytest.raises(ValueError, match="torn-seq"):
        j.drop("some")
