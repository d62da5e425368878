"""config.yaml + command-line overrides -> Settings, with one-line warnings."""

from __future__ import annotations

from pathlib import Path

import pytest

from chatpage.config.settings import (
    SETTING_KEYS,
    Settings,
    config_path,
    format_size,
    load_settings,
    parse_size,
)
from chatpage.engine.config import EngineConfig


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512MiB", 512 << 20),
        ("1G", 1 << 30),
        ("1g", 1 << 30),
        ("2 GiB", 2 << 30),
        ("64K", 65536),
        ("64KiB", 65536),
        ("1KB", 1000),
        ("3MB", 3_000_000),
        ("1GB", 10**9),
        ("1.5G", 3 << 29),
        ("4096", 4096),
        ("10b", 10),
        (" 8 M ", 8 << 20),
        (0, 0),
        (123, 123),
    ],
)
def test_parse_size(text: str | int, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("bad", ["", "abc", "12XB", "-1G", "1..2M", "G", True, 1.5, None, -5])
def test_parse_size_rejects(bad: object) -> None:
    with pytest.raises(ValueError) as info:
        parse_size(bad)  # type: ignore[arg-type]
    message = str(info.value)
    assert "\n" not in message and "size" in message


def test_format_size() -> None:
    assert format_size(512 << 20) == "512 MiB"
    assert format_size(3 << 29) == "1.5 GiB"
    assert format_size(300) == "300 B"
    assert format_size(4 << 40) == "4096 GiB"


def test_defaults_when_no_file(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert config_path() == tmp_path / "chatpage" / "config.yaml"
    settings, warnings = load_settings()
    assert warnings == []
    assert settings == Settings(
        model=None,
        kv_cache=1 << 30,
        block_size=16,
        default_persona="assistant",
        theme="chatpage",
        bindings={},
    )
    assert settings.sources == dict.fromkeys(SETTING_KEYS, "default")


def test_file_and_command_line_layers(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "model: ~/models/smol.gguf\nkv_cache: 1G\nblock_size: 32\ndefault_persona: coder\n"
        "theme: nord\nbindings:\n  new_chat: ctrl+n\n  quit: ctrl+q,f10\n"
    )
    settings, warnings = load_settings(path, overrides={"kv_cache": "256MiB", "theme": None})
    assert warnings == []
    assert settings.model == str(Path.home() / "models" / "smol.gguf")
    assert settings.kv_cache == 256 << 20
    assert settings.block_size == 32
    assert settings.default_persona == "coder"
    assert settings.theme == "nord"
    assert settings.bindings == {"new_chat": "ctrl+n", "quit": "ctrl+q,f10"}
    assert settings.sources["kv_cache"] == "command line"
    assert settings.sources["theme"] == "config.yaml"  # None override = not given
    assert settings.sources["model"] == "config.yaml"


def test_invalid_values_warn_and_fall_back(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(
        "kv_cache: lots\nblock_size: 12\ntheme: ''\nmodel: 5\ncolour: red\n"
        "bindings:\n  ok: f2\n  bad: ctrl + n\n"
    )
    settings, warnings = load_settings(path, overrides={"block_size": 7})
    assert settings.kv_cache == 1 << 30 and settings.block_size == 16
    assert settings.theme == "chatpage" and settings.model is None
    assert settings.bindings == {"ok": "f2"}
    assert settings.sources["block_size"] == "default"
    assert settings.sources["bindings"] == "config.yaml"
    assert all("\n" not in w for w in warnings)
    text = "\n".join(warnings)
    assert "config.yaml: kv_cache = 'lots' is not valid; expected a number of bytes" in text
    assert "config.yaml: block_size = 12 is not valid; expected 8 or 16 or 32" in text
    assert "command line: block_size = 7 is not valid" in text
    assert "unknown setting 'colour'" in text
    assert "bindings.bad = 'ctrl + n'" in text
    assert len(warnings) == 7


def test_cli_override_falls_back_to_file_value(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.write_text("kv_cache: 2G\n")
    settings, warnings = load_settings(path, overrides={"kv_cache": "-1"})
    assert settings.kv_cache == 2 << 30 and settings.sources["kv_cache"] == "config.yaml"
    assert warnings and "using the config.yaml value" in warnings[0]


@pytest.mark.parametrize(
    ("text", "needle"),
    [("a: [1\n", "invalid YAML at line"), ("- 1\n", "expected a mapping"), ("", None)],
)
def test_broken_file_still_starts(tmp_path: Path, text: str, needle: str | None) -> None:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    settings, warnings = load_settings(path)
    assert settings == Settings()
    if needle is None:
        assert warnings == []
    else:
        (warning,) = warnings
        assert needle in warning and str(path) in warning


def test_unreadable_file_warns(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    path.mkdir()  # reading a directory fails even as root
    settings, (warning,) = load_settings(path)
    assert settings == Settings() and "cannot read" in warning


def test_models_dirs_is_a_list_of_folders(tmp_path):
    path = tmp_path / "config.yaml"
    path.write_text("models_dirs: [~/models, /srv/llm]\n")
    settings, warnings = load_settings(path)
    assert warnings == []
    assert settings.models_dirs == (str(Path("~/models").expanduser()), "/srv/llm")
    path.write_text("models_dirs: 7\n")
    settings, warnings = load_settings(path)
    assert settings.models_dirs == ()
    assert warnings == [
        "config.yaml: models_dirs = 7 is not valid; expected a list of folders "
        "holding model folders or .gguf files, e.g. [~/models]; using the "
        "default value"
    ]


def test_kv_disk_bounds_the_disk_tier_and_zero_turns_it_off(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    assert load_settings(path)[0].kv_disk == 4 << 30
    path.write_text("kv_disk: 0\n")
    settings, warnings = load_settings(path, overrides={"kv_disk": None})
    assert (settings.kv_disk, warnings) == (0, [])
    assert EngineConfig.for_settings(settings).kv_disk_bytes == 0
    settings, _ = load_settings(path, overrides={"kv_disk": "2G"})
    assert settings.kv_disk == 2 << 30 and settings.sources["kv_disk"] == "command line"
    path.write_text("kv_disk: lots\n")
    settings, warnings = load_settings(path)
    assert settings.kv_disk == 4 << 30
    assert warnings == [
        "config.yaml: kv_disk = 'lots' is not valid; expected a number of bytes, or a number "
        "with K, M or G (also KiB/MiB/GiB, KB/MB/GB), e.g. 512MiB; 0 turns the disk tier off; using the default value"
    ]
