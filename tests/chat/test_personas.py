"""Persona files: the shipped set, validation, user overrides, one-line errors."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from chatpage.config.paths import shipped_personas_dir
from chatpage.config.personas import (
    InvalidPersona,
    Persona,
    PersonaError,
    default_persona,
    find_persona,
    load_persona_file,
    load_personas,
    parse_persona,
    persona_data,
    persona_dirs,
    save_persona,
)

GOOD = """\
name: pirate
description: Talks like a pirate
system_prompt: |
  You are a pirate.
temperature: 0.9
"""


def write(directory: Path, name: str, text: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / name
    path.write_text(text, encoding="utf-8")
    return path


def test_shipped_personas_load_cleanly() -> None:
    personas, errors = load_personas([shipped_personas_dir()])
    assert errors == []
    names = [p.name for p in personas]
    assert names == sorted(names, key=str.casefold)
    for required in ("assistant", "coder", "reviewer", "writer", "tutor", "shell", "translator"):
        assert required in names
    for persona in personas:
        words = len(persona.system_prompt.split())
        # several 16-token KV blocks, but short enough for a tiny model
        assert 150 <= words <= 300, (persona.name, words)
        assert persona.description and "\n" not in persona.description
        assert persona.source.parent == shipped_personas_dir()
    assert default_persona(personas).name == "assistant"
    assert find_persona(personas, "coder").temperature == pytest.approx(0.2)


def test_parse_all_fields(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "full.yaml",
        GOOD + "greeting: Ahoy!\ntop_p: 1\ntop_k: 40\nmax_tokens: 256\nseed: 3\n",
    )
    (persona,), errors = load_personas([tmp_path])
    assert errors == []
    assert persona == Persona(
        name="pirate",
        description="Talks like a pirate",
        system_prompt="You are a pirate.",
        greeting="Ahoy!",
        temperature=0.9,
        top_p=1.0,
        top_k=40,
        max_tokens=256,
        seed=3,
        source=path,
    )
    assert persona.sampling() == {
        "temperature": 0.9,
        "top_p": 1.0,
        "top_k": 40,
        "max_tokens": 256,
        "seed": 3,
    }
    assert isinstance(persona.top_p, float)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            "name: x\ndescription: d\nsystem_prompt: p\ntemperature: hot\n",
            "'temperature' must be a number >= 0 (0 = greedy), got 'hot'; fix the value or remove the key",
        ),
        ("name: x\ndescription: d\nsystem_prompt: p\ntemperature: -1\n", "'temperature' must be"),
        ("name: x\ndescription: d\nsystem_prompt: p\ntop_p: 0\n", "'top_p' must be a number > 0"),
        ("name: x\ndescription: d\nsystem_prompt: p\ntop_p: 1.5\n", "'top_p'"),
        ("name: x\ndescription: d\nsystem_prompt: p\ntop_k: 2.5\n", "'top_k' must be a whole"),
        ("name: x\ndescription: d\nsystem_prompt: p\ntop_k: true\n", "'top_k'"),
        ("name: x\ndescription: d\nsystem_prompt: p\nmax_tokens: 0\n", "'max_tokens'"),
        ("name: x\ndescription: d\nsystem_prompt: p\nseed: -3\n", "'seed'"),
        ("name: x\ndescription: d\nsystem_prompt: '   '\n", "'system_prompt' must be non-empty"),
        ("name: x\ndescription: d\n", "missing required key 'system_prompt'; add it"),
        ("description: d\nsystem_prompt: p\n", "missing required key 'name'"),
        ("name: x\ndescription: d\nsystem_prompt: p\ncolour: red\n", "unknown key 'colour'"),
        ("name: [1, 2]\ndescription: d\nsystem_prompt: p\n", "'name' must be non-empty text"),
        ('name: x\ndescription: "two\\nlines"\nsystem_prompt: p\n', "single line"),
        ("- a\n- b\n", "the file is a list, not a mapping"),
        ("", "the file is empty"),
        ("name: x\n  bad: [indent\n", "invalid YAML at line"),
    ],
)
def test_broken_file_gives_one_line_error(tmp_path: Path, text: str, expected: str) -> None:
    write(tmp_path, "good.yaml", GOOD)
    bad = write(tmp_path, "bad.yaml", text)
    personas, errors = load_personas([tmp_path])
    assert [p.name for p in personas] == ["pirate"]  # the rest still loads
    (error,) = errors
    assert isinstance(error, PersonaError) and error.path == bad
    line = str(error)
    assert "\n" not in line
    assert "bad.yaml: " in line
    assert expected in line


def test_error_names_the_file_relative_to_cwd(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.chdir(tmp_path)
    bad = write(tmp_path / "personas", "pirate.yaml", GOOD.replace("0.9", "hot"))
    _, (error,) = load_personas([bad.parent])
    assert str(error) == (
        "personas/pirate.yaml: 'temperature' must be a number >= 0 (0 = greedy), got 'hot'; "
        "fix the value or remove the key"
    )


def test_not_utf8_and_unreadable(tmp_path: Path) -> None:
    (tmp_path / "latin.yaml").write_bytes(b"name: caf\xe9\n")
    (tmp_path / "dir.yaml").mkdir()  # a folder named like a persona is skipped, not an error
    _, errors = load_personas([tmp_path])
    assert [e.path.name for e in errors] == ["latin.yaml"]
    assert "UTF-8" in errors[0].message


def test_user_dir_overrides_shipped_by_name(tmp_path: Path) -> None:
    shipped, user = tmp_path / "shipped", tmp_path / "user"
    write(shipped, "pirate.yaml", GOOD)
    write(shipped, "assistant.yaml", GOOD.replace("pirate", "assistant"))
    mine = write(user, "my-pirate.yml", GOOD.replace("You are a pirate.", "Arr."))
    write(user, "notes.txt", "not a persona")
    personas, errors = load_personas([shipped, user])
    assert errors == []
    pirate = find_persona(personas, "pirate")
    assert pirate.system_prompt == "Arr." and pirate.source == mine
    assert [p.name for p in personas] == ["assistant", "pirate"]


def test_broken_user_file_keeps_shipped_one(tmp_path: Path) -> None:
    shipped, user = tmp_path / "shipped", tmp_path / "user"
    write(shipped, "pirate.yaml", GOOD)
    write(user, "pirate.yaml", GOOD.replace("0.9", "hot"))
    personas, errors = load_personas([shipped, user])
    assert find_persona(personas, "pirate").temperature == pytest.approx(0.9)
    assert len(errors) == 1


def test_duplicate_name_in_one_dir(tmp_path: Path) -> None:
    write(tmp_path, "a.yaml", GOOD)
    write(tmp_path, "b.yaml", GOOD)
    personas, (error,) = load_personas([tmp_path])
    assert len(personas) == 1 and personas[0].source.name == "a.yaml"
    assert error.path.name == "b.yaml" and "already used by a.yaml" in error.message


def test_default_dirs_follow_xdg(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))
    assert persona_dirs() == [shipped_personas_dir(), tmp_path / "chatpage" / "personas"]
    write(tmp_path / "chatpage" / "personas", "assistant.yaml", GOOD.replace("pirate", "assistant"))
    personas, errors = load_personas()
    assert errors == []
    assert default_persona(personas).source.parent == tmp_path / "chatpage" / "personas"


def test_default_persona_choice() -> None:
    a = parse_persona({"name": "zed", "description": "d", "system_prompt": "p"}, Path("z.yaml"))
    b = parse_persona({"name": "Coder", "description": "d", "system_prompt": "p"}, Path("c.yaml"))
    assert default_persona([a, b]) is a  # no assistant: the first
    assert default_persona([a, b], preferred="coder") is b  # case-insensitive fallback
    assert default_persona([a, b], preferred="missing") is a
    with pytest.raises(LookupError):
        default_persona([])
    with pytest.raises(ValueError, match="unknown key 'x'"):
        parse_persona({"name": "n", "description": "d", "system_prompt": "p", "x": 1}, Path("f"))


def test_missing_dir_is_not_an_error(tmp_path: Path) -> None:
    assert load_personas([tmp_path / "nope"]) == ([], [])


def test_save_persona_writes_what_the_reader_reads_back(tmp_path):
    shipped, errors = load_personas([persona_dirs()[0]])
    assert shipped and not errors
    out = tmp_path / "mine"
    for persona in shipped:  # multi-line prompts, greetings, every sampling key
        assert save_persona(persona, out) == persona
    assert len(list(out.glob("*.yaml"))) == len(shipped)

    first = shipped[0]
    edited = save_persona(replace(first, description="edited"), out)
    assert edited.source == out / f"{first.name}.yaml"
    assert load_persona_file(edited.source).description == "edited"  # replaced, same file

    (out / "x-y.yaml").write_text("name: other\ndescription: d\nsystem_prompt: s\n")
    kept = save_persona(replace(first, name="x y"), out)
    assert kept.source.name == "x-y-2.yaml" and load_persona_file(out / "x-y.yaml").name == "other"

    with pytest.raises(ValueError, match="'top_p' must be a number > 0 and <= 1"):
        save_persona(replace(first, name="bad", top_p=3.0), out)
    assert not (out / "bad.yaml").exists()


def test_speculate_is_auto_or_off() -> None:
    base = {"name": "s", "description": "d", "system_prompt": "p"}
    assert parse_persona(base, Path("s.yaml")).speculate is True
    for off in ("off", False):  # (YAML reads a bare off as false)
        persona = parse_persona({**base, "speculate": off}, Path("s.yaml"))
        assert persona.speculate is False and persona_data(persona)["speculate"] == "off"
    with pytest.raises(InvalidPersona, match="'speculate' must be auto or off"):
        parse_persona({**base, "speculate": "sometimes"}, Path("s.yaml"))
