"""`sangama-app`, the desktop tray app's entry point."""

from __future__ import annotations

import sys


def main() -> int:
    # Qt lives in app.ui only (docs/architecture.md); importing it here keeps `sangama` headless.
    from app.ui.tray import run_app

    return run_app(sys.argv)


if __name__ == "__main__":
    raise SystemExit(main())
