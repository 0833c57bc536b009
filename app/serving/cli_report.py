"""The headless worker's view of its status (`sangama worker`): the stdout lines the
demo, the lab, tests and benches parse (app.node_status.announced_lines), and notes on
stderr for downloads and stage changes. The tray shows the same `NodeStatus` values in
its own way (app.ui)."""

from __future__ import annotations

import sys

from app.node_status import NodeStatus, ServeState, announced_lines


class CliReport:
    """A `StatusReport` printing what a person or a script watching the terminal needs."""

    def __init__(self) -> None:
        self.shown: NodeStatus | None = None
        self.tenths = -1

    def __call__(self, status: NodeStatus) -> None:
        tenths = int(status.progress * 10)
        if status.state is ServeState.DOWNLOADING and tenths != self.tenths:
            print(f"downloading: {tenths * 10}%", file=sys.stderr, flush=True)
            self.tenths = tenths
        for line in announced_lines(self.shown, status):
            print(line, flush=True)
        if self.shown is None or status.state is not self.shown.state:
            if status.state is ServeState.MOVING:
                print(
                    f"{status.node_id}: assignment changed; rebuilding the stage", file=sys.stderr
                )
            elif status.state is ServeState.PAUSING and status.finishing:
                print(
                    f"{status.node_id}: finishing {status.finishing} sessions before stopping",
                    file=sys.stderr,
                )
        self.shown = status
