"""What the app reads from a real terminal, where Textual's reading differs from what the keys
mean here.

Terminals that send alt+KEY as ESC then KEY (xterm, GNOME Terminal, tmux: most on Linux) send
alt+1 as ``ESC 1``. Textual reads those ten sequences as the characters macOS's Option key types
(alt+2 would insert ``™``), for WezTerm on macOS; here alt+1 ... alt+9 go to a chat. Without
those entries Textual reads ``ESC 1`` as it reads ``ESC e``: the key ``alt+1`` (with ``1`` as
its character, which `PromptInput` never types).
"""

from __future__ import annotations

from typing import cast

from textual import _ansi_sequences  # Textual's table of terminal sequences (no public API)

ALT_DIGITS = tuple(f"\x1b{digit}" for digit in "0123456789")


def read_alt_digits() -> None:
    """Make ``ESC 0`` ... ``ESC 9`` read as alt+0 ... alt+9 (idempotent)."""
    table = cast(dict[str, object], _ansi_sequences.ANSI_SEQUENCES_KEYS)  # a dict, typed Mapping
    for sequence in ALT_DIGITS:
        table.pop(sequence, None)
