"""A child process ends with its parent, however the parent ends.

Two mechanisms, because either alone leaves a gap:

- Linux: the child asks the kernel for SIGTERM when its parent dies (prctl
  PR_SET_PDEATHSIG, set between fork and exec by `child_preexec`). It covers kill -9 of
  the parent, but only on Linux.
- Everywhere (Windows too): the parent hands the child the read end of a pipe as its
  stdin and never writes to it. When the parent dies, however it dies, the OS closes the
  write end and the child reads EOF; `watch_parent` then stops the child with SIGTERM
  (its normal, clean stop) and exits hard if that has not ended it in `grace_s`.

`sangama` starts the watch when the parent set PARENT_WATCH_ENV (app/lab/processes.py
does for every child it starts).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import sys
import threading
import time

PARENT_WATCH_ENV = "SANGAMA_PARENT_WATCH"
PR_SET_PDEATHSIG = 1


def child_preexec(parent_pid: int) -> None:
    """Run in the child between fork and exec (Linux): SIGTERM when the parent dies. If
    the parent died before the request took effect, stop now."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0)
    if os.getppid() != parent_pid:
        os._exit(1)


def watch_parent(grace_s: float = 10.0) -> threading.Thread:
    """Stop this process once its stdin (the parent's pipe) reaches EOF."""

    def run() -> None:
        # The raw descriptor, not sys.stdin: a thread blocked inside the buffered reader
        # holds its lock, and the interpreter aborts on it at exit.
        fd = sys.stdin.fileno() if sys.stdin is not None else -1
        with contextlib.suppress(OSError):
            while fd >= 0 and os.read(fd, 4096):
                pass  # the parent never writes; anything read is ignored
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(grace_s)
        os._exit(3)  # the clean stop hung: do not outlive the parent anyway

    thread = threading.Thread(target=run, name="parent-watch", daemon=True)
    thread.start()
    return thread


def maybe_watch_parent() -> None:
    """Start the watch if the parent asked for it (in the environment)."""
    # Popped: a grandchild has another parent and another stdin.
    if os.environ.pop(PARENT_WATCH_ENV, None) == "1":
        watch_parent()
