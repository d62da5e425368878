"""HelpScreen: the keys (as remapped by the user's config) and the slash commands, as the chat
screen lists them from the table of actions."""

from __future__ import annotations

from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.screen import ModalScreen
from textual.widgets import Markdown

INTRO = """\
# chatpage

Many chats at once over one local paged-KV engine. Each chat has a persona; its system prompt is
prefilled once and pinned, so every chat with that persona starts from the shared cache.
The gauge at the bottom is the engine's KV block pool, live.

In the message box: **enter** sends, **ctrl+j** (or **shift+enter** where the terminal reports it)
starts a new line, **up**/**down** on the first/last line walk through your earlier prompts,
**tab** completes a slash command, a persona name or a `/file` path, **ctrl+e** opens the draft
in your `$EDITOR`. While the box has text, **ctrl+w** and **ctrl+a** edit it (delete a word, go
to the line start); empty, they close the chat and cycle the alternatives. Each chat keeps its
own draft, across restarts too.

With alternatives on show, **1**-**6** or a click keeps one; typing goes back to the message box.
Click **copy** on a message to copy it, or click a code block to copy the block (to the system
clipboard where there is one, else through the terminal: the notice says which).

**alt+up**/**alt+down** (or **j**/**k** in the transcript) move through the messages; on one,
**c** copies it, **b** copies a code block, **e** edits it, **r** asks again for a reply, **d**
deletes it, **[**/**]** show the other versions where the chat forks.
"""


def _cell(text: str) -> str:
    return text.replace("\\", "\\\\").replace("|", "\\|").replace("`", "'")


class HelpScreen(ModalScreen[None]):
    BINDINGS = [
        Binding("escape,f1,q", "close", "Close", id="help_close"),
    ]

    def __init__(self, keys: list[tuple[str, str, str]], commands: list[tuple[str, str]]) -> None:
        """``keys``: (key, binding id, description) rows; ``commands``: (usage, help) rows."""
        super().__init__(classes="dialog-screen")
        self.keys = keys
        self.commands = commands

    def compose(self) -> ComposeResult:
        lines = [
            INTRO,
            "## Keys",
            "",
            "| key | id (for `bindings:` in config.yaml) | action |",
            "|---|---|---|",
        ]
        lines += [f"| `{_cell(k)}` | `{_cell(i)}` | {_cell(d)} |" for k, i, d in self.keys]
        lines += ["", "## Commands", "", "| command | what it does |", "|---|---|"]
        lines += [f"| `{_cell(usage)}` | {_cell(what)} |" for usage, what in self.commands]
        lines += ["", "Start a message with `//` to send text that begins with `/`."]
        with Vertical(classes="dialog help"):
            yield Markdown("\n".join(lines))

    def action_close(self) -> None:
        self.dismiss(None)
