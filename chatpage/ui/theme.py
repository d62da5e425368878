"""The app's own theme, "chatpage" (the default; any Textual theme can be chosen instead).

Widgets use only the standard theme variables, so every theme styles the whole app.
"""

from __future__ import annotations

from textual.theme import Theme

CHATPAGE_THEME = Theme(
    name="chatpage",
    primary="#5FA8D3",
    secondary="#8E7CC3",
    accent="#F2A541",
    warning="#F2A541",
    error="#E5534B",
    success="#57AB5A",
    foreground="#D8DEE9",
    background="#14181F",
    surface="#1B2029",
    panel="#232A35",
    dark=True,
    variables={"footer-key-foreground": "#F2A541"},
)
