"""Exports are written all or nothing: a full disk leaves no empty or partial file."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from chatpage.store.io import write_whole


def _full_disk(monkeypatch) -> None:
    def fsync(_fd: int) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", fsync)


@pytest.mark.parametrize("replace", [True, False])
def test_a_full_disk_leaves_nothing(tmp_path: Path, monkeypatch, replace: bool) -> None:
    _full_disk(monkeypatch)
    target = tmp_path / "chat.md"
    with pytest.raises(OSError, match="No space left"):
        write_whole(target, "x" * 10_000, replace=replace)
    assert list(tmp_path.iterdir()) == []  # neither the file nor the temporary one


def test_a_full_disk_keeps_the_old_file(tmp_path: Path, monkeypatch) -> None:
    target = tmp_path / "chat.md"
    target.write_text("before")
    _full_disk(monkeypatch)
    with pytest.raises(OSError):
        write_whole(target, "after")
    assert target.read_text() == "before"
    assert list(tmp_path.iterdir()) == [target]


def test_exclusive_never_overwrites(tmp_path: Path) -> None:
    target = tmp_path / "chat.md"
    write_whole(target, "first", replace=False)
    with pytest.raises(FileExistsError):
        write_whole(target, "second", replace=False)
    write_whole(target, "third")
    assert target.read_text() == "third"
    assert list(tmp_path.iterdir()) == [target]


def test_cli_export_on_a_full_disk_fails_without_a_file(
    tmp_path: Path, monkeypatch, capsys
) -> None:
    from chatpage.cli.main import main
    from chatpage.store import Store

    with Store.open() as store:
        sid = store.create_session("a chat", "assistant")
        store.add_message(sid, "user", "hello")
    _full_disk(monkeypatch)
    target = tmp_path / "out.json"
    assert main(["export", str(sid), "--format", "json", "-o", str(target)]) == 1
    assert "No space left" in capsys.readouterr().err
    assert not target.exists() and not list(tmp_path.glob(".out.json.*"))
