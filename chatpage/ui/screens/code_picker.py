"""CodeBlockPicker: choose one of a message's code blocks to copy (type to filter, enter)."""

from __future__ import annotations

from rich.text import Text
from textual.widgets.option_list import Option

from chatpage.ui.screens.list_dialog import ListDialog
from chatpage.ui.text import one_line


class CodeBlockPicker(ListDialog[str]):
    """Dismisses with the code of the block picked, or None on escape."""

    def __init__(self, blocks: list[str]) -> None:
        super().__init__("Copy which code block?", "filter by the code's text", "code-picker")
        self.blocks = blocks

    def options(self, text: str) -> list[Option]:
        needle = text.casefold().strip()
        return [
            self._option(n, block)
            for n, block in enumerate(self.blocks)
            if not needle or needle in block.casefold()
        ]

    def result(self, option_id: str) -> str | None:
        return self.blocks[int(option_id)]

    def empty_note(self, text: str) -> str:
        return "no code block contains that"

    @staticmethod
    def _option(number: int, block: str) -> Option:
        lines = block.count("\n") + 1
        text = Text(f"{number + 1}. ", style="bold")
        text.append(one_line(block, 60))
        text.append(f"  ({lines} line{'s' if lines != 1 else ''})", style="italic dim")
        return Option(text, id=str(number))
