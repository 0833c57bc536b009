"""`sangama-app`, the desktop tray app's entry point."""

from __future__ import annotations

import sys


def main() -> int:
    # The tray app is the desktop-app issue's work; say so plainly rather than pretend.
    print(
        "sangama-app: the desktop tray app is not built yet; use the `sangama` command "
        "(sangama demo, sangama generate, sangama hardware).",
        file=sys.stderr,
    )
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
