"""Where chatpage keeps things (XDG paths), its settings file and the personas."""
