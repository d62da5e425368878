"""Making model and user text safe to show: control characters become visible symbols.

Nothing shown in the UI is parsed as Rich/Textual markup (widgets get ``Text``/``Content`` or go
through the Markdown widget, which does not read markup); this module handles the other hazard:
raw control characters (an ESC from a model could restyle or clear the terminal).
"""

from __future__ import annotations

import re

_C0 = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_C1 = re.compile(r"[\x80-\x9f]")


def _picture(match: re.Match[str]) -> str:
    code = ord(match.group())
    return "\u2421" if code == 0x7F else chr(0x2400 + code)  # ␡, or ␀..␟ (ESC -> ␛)


def clean(text: str) -> str:
    """``text`` with every C0/C1 control character except newline and tab shown as a symbol.

    ``\\r\\n`` line ends become ``\\n``; other controls become Unicode control pictures
    (``\\x1b`` -> ``␛``, ``\\x07`` -> ``␇``, ``\\r`` -> ``␍``) or ``\\x9b``-style escapes.
    """
    text = text.replace("\r\n", "\n")
    text = _C0.sub(_picture, text)
    return _C1.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def one_line(text: str, width: int) -> str:
    """The first line of ``text`` (cleaned), cut to ``width`` characters with an ellipsis."""
    first = clean(text).strip().split("\n", 1)[0].strip()
    return first if len(first) <= width else first[: max(1, width - 1)].rstrip() + "…"


def markup_literal(text: str) -> str:
    """``text`` (cleaned) for the few Textual APIs that only take markup (the command palette):
    every ``[`` is escaped, so no tag, closing tag or lone bracket is ever interpreted."""
    return clean(text).replace("[", "\\[")


def code_blocks(markdown: str) -> list[str]:
    """The contents of the fenced/indented code blocks in ``markdown``, in order."""
    from markdown_it import MarkdownIt

    return [
        token.content.rstrip("\n")
        for token in MarkdownIt("gfm-like").parse(markdown)
        if token.type in ("fence", "code_block")
    ]
