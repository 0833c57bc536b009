"""Qt widgets only (tray, join dialog, chat window, status window)."""
