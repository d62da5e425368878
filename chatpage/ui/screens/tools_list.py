"""ToolsList (/tools): the MCP servers of config.yaml, each with its state (running, failed
and why, not started) and its tools; what the chat on show may use."""

from __future__ import annotations

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static

from chatpage.chat.mcp import McpServers, McpTool, ServerState
from chatpage.chat.session import ChatSession
from chatpage.chat.tool_turns import always_allowed, chat_tools, server_names
from chatpage.ui.text import clean


def tools_text(servers: McpServers, session: ChatSession | None) -> Text:
    """The listing, as plain text (names and reasons come from servers: never markup)."""
    if not servers:
        return Text(
            "No MCP servers are configured. Add them to config.yaml under mcp_servers: "
            "(see the README)."
        )
    used = set(server_names(session.persona, servers)) if session is not None else set()
    offered = {t.name: t for t in chat_tools(session.persona, servers)} if session else {}
    out = Text()
    for name, server in servers.servers.items():
        state = str(server.state)
        if server.state == ServerState.FAILED:
            state += f": {server.why}"
        mark = " (this chat)" if name in used else ""
        out.append(f"{name}{mark} · {state}\n", style="bold")
        out.append(f"  {server.config.describe()}\n")
        for tool in server.tools:
            note = _note(tool, offered.get(tool.name), session) if name in used else ""
            first = tool.description.splitlines()[0] if tool.description else ""
            out.append(f"  - {name}/{tool.name}{note}: {first}\n")
    return Text(clean(out.plain), spans=out.spans)


def _note(tool: McpTool, offered: McpTool | None, session: ChatSession | None) -> str:
    """What a tool of one of the chat's servers is to the chat: allowed for good, or not
    offered because another server's tool of that name is."""
    if offered is not None and offered.server != tool.server:
        return f" (not offered: {offered.server}/{tool.name} is)"
    if session is not None and always_allowed(session, tool):
        return " (always allowed in this chat)"
    return ""


class ToolsList(ModalScreen[None]):
    BINDINGS = [Binding("escape,q", "close", "Close", id="tools_close")]

    def __init__(self, listing: Text) -> None:
        super().__init__(classes="dialog-screen")
        self.listing = listing

    def compose(self) -> ComposeResult:
        with VerticalScroll(classes="dialog help"):
            yield Static(Text("MCP servers and tools", style="bold"), classes="dialog-title")
            yield Static(self.listing, id="tools-listing")

    def action_close(self) -> None:
        self.dismiss(None)
