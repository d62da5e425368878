"""What the user can do: one table of actions (`table.ACTIONS`), each with its id, default key,
slash command and aliases, help text and handler; the handlers, grouped by what they act on
(`sessions`, `turns`, `settings`, and `message` for a focused message's keys). A handler gets
what it acts on explicitly (`action.Controls`: the chat screen's offer) and calls `Chats`."""
