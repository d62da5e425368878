"""What the app reads from a real terminal, where Textual's reading differs from what the keys
mean here (`read_keys_as_meant` puts both right, once, before the app starts).

Terminals that send alt+KEY as ESC then KEY (xterm, GNOME Terminal, tmux: most on Linux) send
alt+1 as ``ESC 1``. Textual reads those ten sequences as the characters macOS's Option key types
(alt+2 would insert ``™``), for WezTerm on macOS; here alt+1 ... alt+9 go to a chat. Without
those entries Textual reads ``ESC 1`` as it reads ``ESC e``: the key ``alt+1`` (with ``1`` as
its character, which `PromptInput` never types).

A bracketed paste that holds an ESC (text copied from a terminal, with its colours) is cut by
Textual's parser at each ESC: what follows it comes as keys, before the paste itself, so the
text lands out of order. `PasteParser` hands the parser each ESC inside a paste as ``␛`` (how
the app shows an ESC anywhere), so the paste stays one piece, in order.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import cast

from textual import _ansi_sequences  # Textual's table of terminal sequences (no public API)
from textual._xterm_parser import XTermParser
from textual.drivers import linux_driver
from textual.message import Message

ALT_DIGITS = tuple(f"\x1b{digit}" for digit in "0123456789")
PASTE_START, PASTE_END = "\x1b[200~", "\x1b[201~"
ESC_SHOWN = "\u241b"  # ␛, as `chatpage.ui.text.clean` shows an ESC


def read_keys_as_meant() -> None:
    """Make ``ESC 0`` ... ``ESC 9`` read as alt+0 ... alt+9, and pastes keep their ESCs in
    place (idempotent)."""
    table = cast(dict[str, object], _ansi_sequences.ANSI_SEQUENCES_KEYS)  # a dict, typed Mapping
    for sequence in ALT_DIGITS:
        table.pop(sequence, None)
    linux_driver.XTermParser = PasteParser  # type: ignore[misc]  # the parser the driver makes


def _partial_suffix(text: str, marker: str) -> int:
    """How many characters at the end of ``text`` begin ``marker`` (0: none)."""
    for size in range(min(len(marker) - 1, len(text)), 0, -1):
        if text.endswith(marker[:size]):
            return size
    return 0


class PasteParser(XTermParser):
    """Textual's parser, given each ESC inside a bracketed paste as ``␛``."""

    def __init__(self, debug: bool = False) -> None:
        super().__init__(debug)
        self._pasting = False
        self._seen = ""  # the end of what was fed outside a paste (a start marker may span feeds)
        self._held = ""  # inside a paste: an end that may be the start of the end marker

    def feed(self, data: str) -> Iterable[Message]:
        if not data:  # the end of input: what was held back goes too
            held, self._held = self._held, ""
            return [*super().feed(held), *super().feed("")] if held else super().feed("")
        masked = self._mask(data)
        return super().feed(masked) if masked else ()  # (feeding "" would end the input)

    def _mask(self, data: str) -> str:
        out: list[str] = []
        text, self._held = self._held + data, ""
        while text:
            if not self._pasting:
                window = self._seen + text
                start = window.find(PASTE_START)
                if start < 0:
                    out.append(text)
                    self._seen = window[-(len(PASTE_START) - 1) :]
                    return "".join(out)
                cut = start + len(PASTE_START) - len(self._seen)  # where the paste begins
                out.append(text[:cut])
                text, self._seen, self._pasting = text[cut:], "", True
                continue
            end = text.find(PASTE_END)
            if end < 0:
                keep = _partial_suffix(text, PASTE_END)
                body, self._held = text[: len(text) - keep], text[len(text) - keep :]
                out.append(body.replace("\x1b", ESC_SHOWN))
                return "".join(out)
            out.append(text[:end].replace("\x1b", ESC_SHOWN) + PASTE_END)
            text, self._pasting = text[end + len(PASTE_END) :], False
        return "".join(out)
