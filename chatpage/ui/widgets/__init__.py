"""One focused widget per module."""
