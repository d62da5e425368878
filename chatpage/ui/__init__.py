"""The Textual UI (`chatpage.ui.app.ChatApp`); it talks to the engine only through
`chatpage.engine.client`."""
