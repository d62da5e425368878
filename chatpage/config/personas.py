"""Personas: YAML files -> frozen `Persona` records, with one-line errors for broken files.

A persona file is a YAML mapping::

    name: coder                       # required, one line
    description: Senior engineer      # required, one line
    system_prompt: |                  # required, non-empty
      You are ...
    greeting: Hi!                     # optional
    temperature: 0.2                  # optional sampling defaults
    top_p: 0.9
    top_k: 40
    max_tokens: 1024
    seed: 7
    tools: [files, search/web_search]  # optional: MCP servers (all their tools) or server/tool;
                                      # [] none; unset: every server in config.yaml
    tool_choice: auto                 # optional: auto, none, required or a tool's name
    response_format: reply.schema.json  # optional: a JSON schema file (relative to this file)
                                        # that every reply follows

Shipped personas live in ``personas/``; the user's own live in ``config_dir()/personas`` and
replace a shipped persona of the same name. A broken file never stops the others from loading.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from chatpage.config.paths import config_dir, shipped_personas_dir
from chatpage.vocab import CHAT_SETTINGS, RULE_BY_FIELD, UserError

DEFAULT_PERSONA = "assistant"
"""The persona a new chat uses unless the user configured another one."""

REQUIRED_KEYS = ("name", "description", "system_prompt")
SAMPLING_KEYS = tuple(rule.field for rule in CHAT_SETTINGS)
TOOL_KEYS = ("tools", "tool_choice", "response_format")
OPTIONAL_KEYS = ("greeting", *SAMPLING_KEYS, *TOOL_KEYS, "speculate")
TOOL_CHOICES = ("auto", "none", "required")
_TOOL_ENTRY = re.compile(r"^[A-Za-z0-9_-]{1,40}(/[A-Za-z0-9_.-]{1,64})?$")
_SUFFIXES = (".yaml", ".yml")
_MAX_NAME = 40


@dataclass(frozen=True)
class Persona:
    """One persona: who the model is in a chat, plus its sampling defaults (None = unset)."""

    name: str
    description: str
    system_prompt: str
    greeting: str | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int | None = None
    seed: int | None = None
    tools: tuple[str, ...] | None = None  # MCP servers or server/tool (None: every server)
    tool_choice: str = "auto"  # auto, none, required, or the name of the tool it must call
    response_format: Path | None = None  # a JSON schema file every reply follows
    response_schema: str | None = field(default=None, compare=False)  # that file's JSON text
    speculate: bool = True  # speculate: auto | off (draftless speculative decoding)
    source: Path = field(default=Path("<builtin>"), compare=False)

    def sampling(self) -> dict[str, Any]:
        """The sampling defaults this persona sets, e.g. ``{"temperature": 0.2}``."""
        return {key: getattr(self, key) for key in SAMPLING_KEYS if getattr(self, key) is not None}


class InvalidPersona(UserError):
    """A persona that cannot be read, is not valid, or cannot be written; one line saying why
    and what to do."""


@dataclass(frozen=True)
class PersonaError:
    """A persona file that could not be loaded; ``str()`` is one line for the user."""

    path: Path
    message: str

    def __str__(self) -> str:
        return f"{_display(self.path)}: {self.message}"


def _display(path: Path) -> str:
    """The path as the user would type it: relative to the cwd or ~ when it is below them."""
    for base, prefix in ((Path.cwd(), ""), (Path.home(), "~/")):
        try:
            return prefix + str(path.resolve().relative_to(base.resolve()))
        except (ValueError, OSError):
            continue
    return str(path)


def _text(key: str, value: object, *, one_line: bool) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InvalidPersona(
            f"{key!r} must be non-empty text, got {value!r}; write some text for it"
        )
    value = value.strip()
    if one_line and "\n" in value:
        raise InvalidPersona(f"{key!r} must be a single line; put it on one line")
    return value


def _name(value: object) -> str:
    name = _text("name", value, one_line=True)
    if len(name) > _MAX_NAME:
        raise InvalidPersona(f"'name' must be at most {_MAX_NAME} characters; shorten it")
    return name


def _number(key: str, value: object) -> float | int | None:
    """A sampling default, checked by its rule (None: not set)."""
    if value is None:
        return None
    rule = RULE_BY_FIELD[key]
    if not rule.ok(value):
        raise InvalidPersona(
            f"{key!r} must be {rule.allowed}, got {value!r}; fix the value or remove the key"
        )
    return rule.kind(value)


def _tools(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, list) or not all(
        isinstance(v, str) and _TOOL_ENTRY.match(v) for v in value
    ):
        raise InvalidPersona(
            f"'tools' must be a list of MCP server names or server/tool, got {value!r}; "
            "e.g. tools: [files, search/web_search], or [] for none"
        )
    return tuple(value)


def _tool_choice(value: object) -> str:
    if value is None:
        return "auto"
    if not isinstance(value, str) or not (
        value in TOOL_CHOICES or re.match(r"^[A-Za-z0-9_.-]{1,64}$", value)
    ):
        raise InvalidPersona(
            f"'tool_choice' must be auto, none, required or a tool's name, got {value!r}"
        )
    return value


def _speculate(value: object) -> bool:
    # (YAML reads a bare on / off as true / false)
    if value is None or value is True or value == "auto":
        return True
    if value is False or value == "off":
        return False
    raise InvalidPersona(f"'speculate' must be auto or off, got {value!r}")


def _response_format(value: object, source: Path) -> tuple[Path | None, str | None]:
    """The schema file (relative to the persona file) and its JSON text."""
    if value is None:
        return None, None
    if not isinstance(value, str) or not value.strip():
        raise InvalidPersona(
            f"'response_format' must be the path of a JSON schema file, got {value!r}"
        )
    path = Path(value.strip()).expanduser()
    if not path.is_absolute():
        path = source.parent / path
    try:
        schema = json.loads(path.read_text(encoding="utf-8"))
    except OSError as err:
        raise InvalidPersona(
            f"'response_format': cannot read {_display(path)} ({err.strerror or err}); "
            "give the path of a JSON schema file, relative to the persona file"
        ) from None
    except ValueError as err:
        raise InvalidPersona(
            f"'response_format': {_display(path)} is not JSON ({err}); fix the file"
        ) from None
    if not isinstance(schema, dict):
        raise InvalidPersona(
            f"'response_format': {_display(path)} must hold a JSON schema object, "
            f"not a {type(schema).__name__}"
        )
    return path.resolve(), json.dumps(schema, sort_keys=True)


def parse_persona(data: object, source: Path) -> Persona:
    """Validate one parsed YAML document; raises InvalidPersona with a one-line reason."""
    if not isinstance(data, dict):
        kind = "empty" if data is None else f"a {type(data).__name__}"
        raise InvalidPersona(
            f"the file is {kind}, not a mapping; write keys like 'name:', 'description:' "
            "and 'system_prompt:'"
        )
    unknown = [str(key) for key in data if key not in REQUIRED_KEYS + OPTIONAL_KEYS]
    if unknown:
        allowed = ", ".join(REQUIRED_KEYS + OPTIONAL_KEYS)
        listed = ", ".join(repr(key) for key in unknown)
        raise InvalidPersona(f"unknown key {listed}; remove it or use one of: {allowed}")
    missing = [key for key in REQUIRED_KEYS if data.get(key) is None]
    if missing:
        listed = ", ".join(repr(key) for key in missing)
        raise InvalidPersona(f"missing required key {listed}; add it")
    greeting = data.get("greeting")
    # each checked by its rule, and of its rule's kind
    sampling: dict[str, Any] = {key: _number(key, data.get(key)) for key in SAMPLING_KEYS}
    response_format, response_schema = _response_format(data.get("response_format"), source)
    return Persona(
        name=_name(data["name"]),
        description=_text("description", data["description"], one_line=True),
        system_prompt=_text("system_prompt", data["system_prompt"], one_line=False),
        greeting=None if greeting is None else _text("greeting", greeting, one_line=False),
        source=source,
        tools=_tools(data.get("tools")),
        tool_choice=_tool_choice(data.get("tool_choice")),
        response_format=response_format,
        response_schema=response_schema,
        speculate=_speculate(data.get("speculate")),
        **sampling,
    )


def load_persona_file(path: Path) -> Persona:
    """Read and validate one persona file; raises InvalidPersona with a one-line reason."""
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise InvalidPersona("the file is not UTF-8 text; save it as UTF-8") from None
    except OSError as err:
        raise InvalidPersona(
            f"cannot read the file ({err.strerror}); check its permissions"
        ) from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(err, "problem", None) or "not valid YAML"
        raise InvalidPersona(f"invalid YAML{where}: {problem}; fix the syntax") from None
    return parse_persona(data, path)


def persona_dirs() -> list[Path]:
    """Where personas are looked up, lowest precedence first: shipped, then the user's."""
    return [shipped_personas_dir(), config_dir() / "personas"]


def _files(directory: Path) -> Iterable[Path]:
    try:
        entries = sorted(directory.iterdir())
    except OSError:
        return []
    return [p for p in entries if p.suffix in _SUFFIXES and p.is_file()]


def load_personas(dirs: list[Path] | None = None) -> tuple[list[Persona], list[PersonaError]]:
    """Load every persona from `dirs` (default: `persona_dirs()`), later dirs winning by name.

    Returns the personas sorted by name and one PersonaError per file that could not be used.
    A missing directory is not an error.
    """
    by_name: dict[str, Persona] = {}
    errors: list[PersonaError] = []
    for directory in persona_dirs() if dirs is None else dirs:
        seen_here: dict[str, Path] = {}
        for path in _files(directory):
            try:
                persona = load_persona_file(path)
            except InvalidPersona as err:
                errors.append(PersonaError(path, str(err)))
                continue
            if persona.name in seen_here:
                first = seen_here[persona.name].name
                errors.append(
                    PersonaError(
                        path,
                        f"name {persona.name!r} is already used by {first}; rename one of them",
                    )
                )
                continue
            seen_here[persona.name] = path
            by_name[persona.name] = persona
    return sorted(by_name.values(), key=lambda p: p.name.casefold()), errors


def find_persona(personas: Iterable[Persona], name: str) -> Persona | None:
    """The persona called `name` (exact match first, then case-insensitive), or None."""
    personas = list(personas)
    for persona in personas:
        if persona.name == name:
            return persona
    for persona in personas:
        if persona.name.casefold() == name.casefold():
            return persona
    return None


def default_persona(personas: Iterable[Persona], preferred: str | None = None) -> Persona:
    """The persona a new chat starts with: `preferred`, else "assistant", else the first.

    Raises LookupError when there are no personas at all.
    """
    personas = list(personas)
    for name in (preferred, DEFAULT_PERSONA):
        found = find_persona(personas, name) if name else None
        if found is not None:
            return found
    if not personas:
        raise LookupError("no personas could be loaded; check the personas/ folder")
    return personas[0]


# -- writing ---------------------------------------------------------------------------------------


def persona_data(persona: Persona) -> dict[str, Any]:
    """The persona as the mapping a persona file holds (unset keys left out)."""
    data: dict[str, Any] = {"name": persona.name, "description": persona.description}
    if persona.greeting:
        data["greeting"] = persona.greeting
    data.update(persona.sampling())
    if persona.tools is not None:
        data["tools"] = list(persona.tools)
    if persona.tool_choice != "auto":
        data["tool_choice"] = persona.tool_choice
    if persona.response_format is not None:
        data["response_format"] = str(persona.response_format)
    if not persona.speculate:
        data["speculate"] = "off"
    data["system_prompt"] = persona.system_prompt
    return data


def _block_text(dumper: yaml.SafeDumper, text: str) -> yaml.Node:
    style = "|" if "\n" in text else None  # multi-line text as a literal block, as people write it
    return dumper.represent_scalar("tag:yaml.org,2002:str", text, style=style)


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(str, _block_text)


def persona_yaml(persona: Persona) -> str:
    """The text of a persona file for ``persona`` (it reads back as the same persona)."""
    return yaml.dump(
        persona_data(persona), Dumper=_Dumper, sort_keys=False, allow_unicode=True, width=100
    )


def save_persona(persona: Persona, directory: Path | None = None) -> Persona:
    """Write ``persona`` as a YAML file in ``directory`` (default: the user's personas folder,
    ``config_dir()/personas``) and return it as read back from there.

    The file is ``NAME.yaml`` (the name made safe for a file name); a file there that holds the
    same persona name is replaced, another persona's file never is. Raises InvalidPersona (one line)
    when the persona is not valid or the file cannot be written.
    """
    directory = config_dir() / "personas" if directory is None else directory
    text = persona_yaml(persona)
    parse_persona(yaml.safe_load(text), directory)  # the one validator, before touching disk
    stem = "".join(c if c.isalnum() or c in "-_" else "-" for c in persona.name).strip("-")
    stem = stem or "persona"
    for n in range(1, 100):
        path = directory / (f"{stem}.yaml" if n == 1 else f"{stem}-{n}.yaml")
        if not path.exists() or _holds(path, persona.name):
            break
    else:
        raise InvalidPersona(f"too many persona files named {stem}-N.yaml in {_display(directory)}")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp")
        tmp.write_text(text, encoding="utf-8")
        tmp.replace(path)
    except OSError as err:
        raise InvalidPersona(
            f"cannot write {_display(path)} ({err.strerror or err}); check the folder's permissions"
        ) from None
    return load_persona_file(path)


def _holds(path: Path, name: str) -> bool:
    """Whether the persona file at ``path`` is the persona called ``name``."""
    try:
        return load_persona_file(path).name == name
    except InvalidPersona:
        return False
