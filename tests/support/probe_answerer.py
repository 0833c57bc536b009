"""A UDP port that answers the coordinator's reachability probe (net/reach_probe.py), for
tests that heartbeat as a worker without running one: the coordinator places only nodes
whose address answered.

    with ProbeAnswerer() as answerer:
        beat = {"address": answerer.address, "hardware": HARDWARE, ...}
"""

from __future__ import annotations

import socket
import threading
from types import TracebackType
from typing import Any

from net import reach_probe

HARDWARE: dict[str, Any] = {"gpus": [], "system_total_bytes": 64 << 30, "note": ""}
"""A hardware report backing capacity claims up to 64 GiB (what a worker sends)."""


class ProbeAnswerer:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        self._sock.bind((host, 0))
        self._sock.settimeout(0.2)
        self.address = f"{host}:{self._sock.getsockname()[1]}"
        self.answered = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="probe-answerer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                data, addr = self._sock.recvfrom(256)
            except TimeoutError:
                continue
            except OSError:
                return
            reply = reach_probe.answer_to(data)
            if reply is not None:
                self._sock.sendto(reply, addr)
                self.answered += 1

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2.0)
        self._sock.close()

    def __enter__(self) -> ProbeAnswerer:
        return self

    def __exit__(
        self, _t: type[BaseException] | None, _e: BaseException | None, _tb: TracebackType | None
    ) -> None:
        self.close()
