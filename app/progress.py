"""Download progress as headless commands show it: one line on stderr per finished piece
(stdout stays for the READY line and answers that scripts read)."""

from __future__ import annotations

import sys
from collections.abc import Callable

from coordinator.client.downloads import DownloadProgress, format_progress


def print_progress() -> Callable[[DownloadProgress], None]:
    def show(p: DownloadProgress) -> None:
        if p.finished:
            print(format_progress(p), file=sys.stderr, flush=True)

    return show
