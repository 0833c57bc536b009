"""The desktop app (`sangama-app`): Qt widgets, the controllers behind them, and the
desktop's own settings and chat history. The only package that may import Qt."""
