"""`chatpage history/export/import` and `chatpage config`, driven through a local parser and
tmp XDG dirs."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from chatpage.cli import cache as cache_cli
from chatpage.cli import config as config_cli
from chatpage.cli import history as history_cli
from chatpage.store import Store


@pytest.fixture(autouse=True)
def xdg(tmp_path: Path, monkeypatch) -> Path:
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "data"))
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    return tmp_path


def parser() -> argparse.ArgumentParser:
    main = argparse.ArgumentParser(prog="chatpage")
    main.add_argument("--kv-cache", dest="kv_cache")  # like the real cli's global options
    main.add_argument("--config", dest="config_file", type=Path)
    sub = main.add_subparsers(dest="command")
    history_cli.register(sub)
    config_cli.register(sub)
    cache_cli.register(sub)
    return main


def run(*argv: str) -> int:
    args = parser().parse_args(argv)
    return args.func(args)


@pytest.fixture
def chats() -> tuple[int, int]:
    with Store.open() as store:
        a = store.create_session("Paged attention", "coder", {"temperature": 0.2})
        store.add_message(a, "user", "How do KV blocks work?")
        store.add_message(a, "assistant", "Each block holds sixteen tokens.")
        b = store.create_session("Evil \x1b[31mtitle\nsplit", "writer", {})
        store.add_message(b, "user", "Polish my haiku")
    return a, b


def test_history_lists_sessions(chats, capsys) -> None:
    a, b = chats
    assert run("history") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["ID", "UPDATED", "PERSONA", "MESSAGES", "TITLE"]
    assert out[1].split()[0] == str(b) and out[2].split()[0] == str(a)  # most recent first
    assert out[2].split()[3:] == ["coder", "2", "Paged", "attention"]
    assert "\x1b" not in out[1] and out[1].endswith("Evil [31mtitle split")
    assert len(out) == 3


def test_history_empty(capsys) -> None:
    assert run("history") == 0
    assert capsys.readouterr().out == "No saved chats yet.\n"


def test_history_search(chats, capsys) -> None:
    a, _ = chats
    assert run("history", "search", "kv", "BLOCK") == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].split() == ["ID", "CHAT", "ROLE", "SNIPPET"]
    assert len(out) == 2  # both words needed; the last one ("BLOCK") also as a prefix
    assert out[1].startswith(f"{a} ") and "Paged attention" in out[1] and "«" in out[1]
    assert run("history", "search", 'nothing" OR (*') == 0
    assert "No messages match" in capsys.readouterr().out


def test_export_markdown_to_stdout_and_json_to_file(chats, tmp_path: Path, capsys) -> None:
    a, _ = chats
    assert run("export", str(a)) == 0
    assert capsys.readouterr().out.startswith("# Paged attention\n")
    target = tmp_path / "chat.json"
    assert run("export", str(a), "--format", "json", "-o", str(target)) == 0
    assert str(target) in capsys.readouterr().err
    assert json.loads(target.read_text())["title"] == "Paged attention"


def test_export_unknown_session(capsys) -> None:
    assert run("export", "42") == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "no chat with id 42" in err


def test_export_bad_arguments_exit_2(capsys) -> None:
    for argv in (["export", "abc"], ["export", "1", "--format", "html"], ["history", "nope"]):
        with pytest.raises(SystemExit) as info:
            run(*argv)
        assert info.value.code == 2
    capsys.readouterr()


def test_export_unwritable_output(chats, tmp_path: Path, capsys) -> None:
    a, _ = chats
    assert run("export", str(a), "-o", str(tmp_path / "missing" / "dir" / "x.md")) == 1
    assert "cannot write" in capsys.readouterr().err


def test_import_round_trip(chats, tmp_path: Path, capsys) -> None:
    a, _ = chats
    target = tmp_path / "chat.json"
    run("export", str(a), "-f", "json", "-o", str(target))
    capsys.readouterr()
    assert run("import", str(target)) == 0
    line = capsys.readouterr().out
    assert line.startswith("Imported chat ") and line.rstrip().endswith("Paged attention")
    new_id = int(line.split()[2].rstrip(":"))
    run("export", str(new_id), "-f", "json")
    assert capsys.readouterr().out == target.read_text()


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        (None, "cannot read"),
        (b"\xff\xfe", "not UTF-8"),
        (b"{}", "not a chatpage export"),
    ],
)
def test_import_errors(tmp_path: Path, capsys, content: bytes | None, needle: str) -> None:
    path = tmp_path / "in.json"
    if content is not None:
        path.write_bytes(content)
    assert run("import", str(path)) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and needle in err


def test_import_refused_without_saving(tmp_path: Path, monkeypatch, capsys) -> None:
    (tmp_path / "blocked").write_text("a file, not a directory")
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "blocked"))
    path = tmp_path / "in.json"
    path.write_text(
        '{"format": "chatpage-session", "version": 1, "title": "t", "persona": "p", "messages": []}'
    )
    assert run("import", str(path)) == 1
    err = capsys.readouterr().err.splitlines()
    assert "running without saving" in err[0] and "nothing was imported" in err[1]


def test_config_shows_values_sources_and_warnings(xdg: Path, capsys) -> None:
    config = xdg / "config" / "chatpage" / "config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("block_size: 32\ntheme: nord\nbindings: {new_chat: ctrl+n}\nbogus: 1\n")
    assert run("--kv-cache", "1G", "config") == 0
    captured = capsys.readouterr()
    lines = captured.out.splitlines()
    assert lines[0] == f"config file: {config}"
    rows = {line.split()[0]: line for line in lines[2:]}
    assert rows["block_size"].split()[1:] == ["config.yaml", "32"]
    assert "command line" in rows["kv_cache"] and "1 GiB (1073741824 bytes)" in rows["kv_cache"]
    assert rows["model"].split()[1] == "default" and "(the default model)" in rows["model"]
    assert rows["bindings"].endswith("new_chat=ctrl+n")
    assert captured.err.startswith("chatpage: warning: config.yaml: unknown setting 'bogus'")


def test_config_with_other_file_and_bad_override(tmp_path: Path, capsys) -> None:
    assert run("--config", str(tmp_path / "none.yaml"), "--kv-cache", "huge", "config") == 0
    captured = capsys.readouterr()
    assert captured.out.startswith(f"config file: {tmp_path / 'none.yaml'} (not found)")
    assert "command line: kv_cache = 'huge' is not valid" in captured.err
    assert "1 GiB" in captured.out


def test_cache_shows_the_kv_disk_tier_and_clear_empties_it(xdg: Path, capsys) -> None:
    import torch

    from chatpage.config.paths import kv_dir
    from chatpage.engine.core.kv_tiers import DiskTier

    tensors = [torch.ones(2, 16, 2, 8)]
    tier = DiskTier(kv_dir(), {"model": "m"}, tensors, 1 << 30)
    tier.save([(0, b"a", tuple(range(16))), (1, b"b", tuple(range(16)))])
    tier.close()
    config = xdg / "config" / "chatpage" / "config.yaml"
    config.parent.mkdir(parents=True)
    config.write_text("kv_disk: 1G\n")
    assert run("cache") == 0
    out = capsys.readouterr().out
    assert f"KV disk tier: {kv_dir()}" in out and "of kv_disk 1 GiB" in out
    assert "2 blocks of 1 model/format namespace(s)" in out
    assert run("cache", "clear") == 0
    assert "removed 2.4 KiB of KV blocks" in capsys.readouterr().out
    assert run("cache") == 0
    assert "0 blocks of 0 model/format namespace(s)" in capsys.readouterr().out
