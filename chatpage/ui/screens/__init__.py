"""Modal screens: persona picker, sampling settings, help."""
