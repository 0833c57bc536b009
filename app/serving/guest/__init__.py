"""The good guest: serve while the PC's owner does not need it, step aside when they do."""
