"""ChatSearch: search the text of every saved chat; picking a hit opens its chat."""

from __future__ import annotations

from collections.abc import Callable

from rich.text import Text
from textual.widgets.option_list import Option

from chatpage.store import SNIPPET_MARKS, SearchHit
from chatpage.ui.screens.list_dialog import ListDialog
from chatpage.ui.text import one_line

SNIPPET_WIDTH = 200


def snippet_text(snippet: str) -> Text:
    """A search snippet on one line, the matched words (between SNIPPET_MARKS) in bold; the
    text is never read as markup."""
    start, end = SNIPPET_MARKS
    text = Text(no_wrap=True, overflow="ellipsis")
    for n, part in enumerate(one_line(" ".join(snippet.split()), SNIPPET_WIDTH).split(start)):
        matched, _, rest = part.partition(end) if n else ("", "", part)
        text.append(matched, "bold reverse")
        text.append(rest)
    return text


class ChatSearch(ListDialog[SearchHit]):
    """Dismisses with the hit picked (its chat to open), or None on escape."""

    def __init__(self, search: Callable[[str], list[SearchHit]], term: str = "") -> None:
        super().__init__(
            "Search saved chats", "words to find (every word must match)", "chat-search", term
        )
        self.search = search
        self.hits: dict[str, SearchHit] = {}

    def options(self, text: str) -> list[Option]:
        self.hits = {f"{h.session_id}:{h.message_id}": h for h in self.search(text)}
        return [Option(self._prompt(hit), id=key) for key, hit in self.hits.items()]

    @staticmethod
    def _prompt(hit: SearchHit) -> Text:
        text = Text(
            one_line(hit.session_title, 60), style="bold", no_wrap=True, overflow="ellipsis"
        )
        text.append(f"  {'you' if hit.role == 'user' else hit.role}", style="italic dim")
        text.append("\n  ")
        text.append_text(snippet_text(hit.snippet))
        return text

    def result(self, option_id: str) -> SearchHit | None:
        return self.hits.get(option_id)

    def empty_note(self, text: str) -> str:
        if not text.strip():
            return "type to search the messages of your saved chats"
        return f"no saved message contains {text.strip()!r}"
