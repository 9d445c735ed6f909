"""The debugger's screens: the main view and the key help."""
