"""The conversation model: chats as sessions, slash commands, saving to the store (no Textual)."""
