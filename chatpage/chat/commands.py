"""Slash commands typed in the prompt: parsing and argument checks (no UI here).

``/temp 0.7`` and friends change a session's sampling settings; ``//text`` sends ``/text``.
Every problem is a ValueError with one line for the user.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from chatpage.chat.sampling import SETTING_BY_FIELD
from chatpage.chat.session import MAX_ALTERNATIVES, MIN_ALTERNATIVES, Attachment

MAX_ATTACHMENT_BYTES = 1 << 20
CHARS_PER_TOKEN = 4  # a rough guess before the engine counts exactly


@dataclass(frozen=True)
class CommandInfo:
    name: str
    usage: str
    help: str


def _rule(field: str) -> str:
    rule = SETTING_BY_FIELD[field]
    return f"{rule.label}, {rule.allowed}"


COMMANDS: tuple[CommandInfo, ...] = (
    CommandInfo("help", "/help", "show keys and commands"),
    CommandInfo("new", "/new [PERSONA]", "open a new chat (picks a persona when none is named)"),
    CommandInfo("clear", "/clear", "empty this chat's transcript"),
    CommandInfo("temp", "/temp VALUE", _rule("temperature")),
    CommandInfo("top_p", "/top_p VALUE", _rule("top_p")),
    CommandInfo("top_k", "/top_k VALUE", _rule("top_k")),
    CommandInfo("max", "/max N", "the most tokens a reply may have, "
                f"{SETTING_BY_FIELD['max_tokens'].allowed}"),
    CommandInfo("seed", "/seed N|off", _rule("seed")),
    CommandInfo("samples", "/samples K", f"next reply as K samples side by side "
                                          f"({MIN_ALTERNATIVES}-{MAX_ALTERNATIVES})"),
    CommandInfo("beam", "/beam K", f"next reply by beam search of width K "
                                   f"({MIN_ALTERNATIVES}-{MAX_ALTERNATIVES})"),
    CommandInfo("single", "/single", "next reply as one reply again (alternatives off)"),
    CommandInfo("compare", "/compare temp=0.2,0.8,1.2", "answer your last message once per "
                "value (temp, top_p, top_k, max or seed), side by side"),
    CommandInfo("keep", "/keep N", "keep alternative N as the reply"),
    CommandInfo("file", "/file PATH", "attach a text file to your next message"),
    CommandInfo("detach", "/detach", "drop the files attached to your next message"),
    CommandInfo("stop", "/stop", "stop the reply in progress"),
    CommandInfo("regen", "/regen", "answer your last message again (the old reply stays: "
                "◀ ▶ moves between them)"),
    CommandInfo("edit", "/edit", "put your last message back in the input: sending it forks "
                "the chat there, and the old version stays"),
    CommandInfo("continue", "/continue", "let the last reply go on from where it ended"),
    CommandInfo("copy", "/copy [code]", "copy the last reply (or its last code block)"),
    CommandInfo("title", "/title TEXT", "rename this chat"),
    CommandInfo("search", "/search [WORDS]", "search your saved chats (ctrl+f)"),
    CommandInfo("export", "/export md|json", "write this chat to a file as Markdown or JSON"),
    CommandInfo("settings", "/settings", "open this chat's sampling settings"),
    CommandInfo("system", "/system [TEXT]", "set this chat's system prompt (an editor when no "
                "text is given)"),
    CommandInfo("persona", "/persona [NAME]", "continue this chat as another persona (a picker "
                "when none is named)"),
    CommandInfo("model", "/model [PATH]", "switch the model: a model folder or .gguf file, or "
                "default (a picker when no path is given); chats stay"),
    CommandInfo("saveas", "/saveas [NAME]", "save this chat's persona, system prompt and "
                "settings as a persona of your own (opens the editor)"),
    CommandInfo("quit", "/quit", "quit chatpage"),
)
COMMAND_NAMES = {c.name for c in COMMANDS}
SETTING_COMMANDS = {name: rule.field for rule in SETTING_BY_FIELD.values()
                    for name in (rule.slash, rule.field)}
_ALIASES = {"regenerate": "regen", "exit": "quit", "attach": "file", "off": "single",
            "temperature": "temp", "max_tokens": "max", "topp": "top_p", "topk": "top_k"}


@dataclass(frozen=True)
class Command:
    name: str
    arg: str


def parse_command(text: str) -> Command | None:
    """The command in ``text``, or None when it is a message (``//x`` is the message ``/x``)."""
    stripped = text.strip()
    if not stripped.startswith("/") or stripped.startswith("//"):
        return None
    head, _, arg = stripped[1:].partition(" ")
    name = head.strip().lower()
    name = _ALIASES.get(name, name)
    if name not in COMMAND_NAMES:
        raise ValueError(f"unknown command /{head}; type /help for the list "
                         "(start with // to send a message that begins with /)")
    return Command(name, arg.strip())


def message_text(text: str) -> str:
    """What to send for a non-command line: ``//x`` becomes ``/x``."""
    stripped = text.lstrip()
    return stripped[1:] if stripped.startswith("//") else text


def parse_k(arg: str, what: str) -> int:
    """A number of alternatives (2-6)."""
    allowed = f"a whole number from {MIN_ALTERNATIVES} to {MAX_ALTERNATIVES}"
    try:
        k = int(arg or "3")
    except ValueError:
        raise ValueError(f"{what} must be {allowed}, got {arg!r}") from None
    if not MIN_ALTERNATIVES <= k <= MAX_ALTERNATIVES:
        raise ValueError(f"{what} must be {allowed}, got {k}")
    return k


def parse_compare(arg: str) -> tuple[str, list[str]]:
    """``temp=0.2,0.8,1.2`` -> ("temperature", ["0.2", "0.8", "1.2"])."""
    name, sep, values = arg.partition("=")
    setting = SETTING_COMMANDS.get(name.strip().lower())
    if not sep or setting is None:
        raise ValueError("use /compare SETTING=V1,V2,... with SETTING one of temp, top_p, top_k, "
                         "max, seed; e.g. /compare temp=0.2,0.8,1.2")
    items = [v.strip() for v in values.split(",") if v.strip()]
    if not MIN_ALTERNATIVES <= len(items) <= MAX_ALTERNATIVES:
        raise ValueError(f"/compare takes {MIN_ALTERNATIVES} to {MAX_ALTERNATIVES} values "
                         f"separated by commas, got {len(items)}")
    return setting, items


def read_attachment(arg: str, context_tokens: int | None) -> Attachment:
    """The text file at ``arg``; ValueError when it is missing, binary, huge or cannot fit.

    ``context_tokens`` (the model's window, None before it loads) rejects files that clearly
    cannot fit, by a rough count; the engine's exact count catches the rest when sending.
    """
    if not arg:
        raise ValueError("give a path: /file PATH")
    path = Path(arg.strip().strip("'\"")).expanduser()
    if not path.exists():
        raise ValueError(f"{arg}: no such file")
    if path.is_dir():
        raise ValueError(f"{arg}: is a folder; give a text file")
    try:
        size = path.stat().st_size
        if size > MAX_ATTACHMENT_BYTES:
            raise ValueError(f"{arg}: {size // 1024} KiB is too big to attach (the limit is "
                             f"{MAX_ATTACHMENT_BYTES // 1024} KiB)")
        data = path.read_bytes()
    except OSError as err:
        raise ValueError(f"{arg}: cannot read it ({err.strerror})") from None
    if b"\x00" in data:
        raise ValueError(f"{arg}: looks like a binary file; only text files can be attached")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{arg}: is not UTF-8 text; only text files can be attached") from None
    if context_tokens:
        estimate = len(text) // CHARS_PER_TOKEN
        if estimate >= context_tokens:
            raise ValueError(
                f"{path.name} is about {estimate} tokens but the context window is "
                f"{context_tokens}: it would not fit (about {estimate - context_tokens + 1} "
                "tokens too many)"
            )
    return Attachment(path.name, text)
