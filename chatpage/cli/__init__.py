"""`chatpage` and its subcommands."""
