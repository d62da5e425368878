"""The table's rows of the actions on how the chat on show answers (its sampling settings,
system prompt and persona), then the model's and the app's own: the last rows of
`chatpage.ui.actions.table`."""

from __future__ import annotations

from chatpage.chat.sampling import SETTING_BY_FIELD
from chatpage.ui.actions import sessions, settings
from chatpage.ui.actions.action import Action, PaletteEntry


def _setting(
    name: str, field: str, usage: str, help_text: str = "", aliases: tuple[str, ...] = ()
) -> Action:
    rule = SETTING_BY_FIELD[field]
    return Action(
        f"set_{field}",
        rule.label,
        settings.setting(name, field),
        slash=name,
        aliases=aliases,
        usage=usage,
        help=help_text or f"{rule.label}, {rule.allowed}",
    )


ROWS: tuple[Action, ...] = (
    Action(
        "sampling_settings",
        "Sampling",
        settings.sampling_settings,
        key="f2",
        slash="settings",
        usage="/settings",
        help="open this chat's sampling settings",
    ),
    _setting("temp", "temperature", "/temp VALUE", aliases=("temperature",)),
    _setting("top_p", "top_p", "/top_p VALUE", aliases=("topp",)),
    _setting("top_k", "top_k", "/top_k VALUE", aliases=("topk",)),
    _setting(
        "max",
        "max_tokens",
        "/max N",
        aliases=("max_tokens",),
        help_text=f"the most tokens a reply may have, {SETTING_BY_FIELD['max_tokens'].allowed}",
    ),
    _setting("seed", "seed", "/seed N|off"),
    Action(
        "system_prompt",
        "System prompt",
        settings.system_prompt,
        slash="system",
        usage="/system [TEXT]",
        help="set this chat's system prompt (an editor when no text is given)",
        palette=(
            PaletteEntry(
                "Edit this chat's system prompt", "the chat's own system prompt (/system)"
            ),
        ),
    ),
    Action(
        "switch_persona",
        "Persona",
        settings.switch_persona,
        slash="persona",
        usage="/persona [NAME]",
        argument="persona",
        help="continue this chat as another persona (a picker when none is named)",
        palette=(
            PaletteEntry("Switch this chat's persona", "continue as another persona (/persona)"),
        ),
    ),
    Action(
        "save_as_persona",
        "Save as persona",
        settings.save_as_persona,
        slash="saveas",
        usage="/saveas [NAME]",
        help="save this chat's persona, system prompt and settings "
        "as a persona of your own (opens the editor)",
        palette=(
            PaletteEntry(
                "Save this chat as a persona",
                "a persona file of your own, from this chat's system prompt and settings (/saveas)",
            ),
        ),
    ),
    Action(
        "switch_model",
        "Switch model",
        sessions.switch_model,
        slash="model",
        usage="/model [PATH]",
        help="switch the model: a model folder or .gguf file, or "
        "default (a picker when no path is given); chats stay",
        palette=(
            PaletteEntry(
                "Switch model",
                "a model folder, a .gguf file or the default model; the chats stay (/model)",
            ),
        ),
    ),
    Action(
        "tools",
        "Tools",
        sessions.show_tools,
        slash="tools",
        usage="/tools",
        help="the MCP servers of config.yaml, their state (running, failed and why, not "
        "started) and their tools",
        palette=(PaletteEntry("MCP tools", "the MCP servers, their state and tools (/tools)"),),
    ),
    Action(
        "interrupt", "Stop or quit", sessions.interrupt, key="ctrl+c", show=False, priority=True
    ),
    Action(
        "quit",
        "Quit",
        sessions.quit_app,
        slash="quit",
        aliases=("exit",),
        usage="/quit",
        help="quit chatpage",
    ),
)
