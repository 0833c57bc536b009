"""The desktop app's brains: QObjects with signals, and the one background asyncio thread.

The Qt main thread touches widgets only. One background thread owns the
asyncio loop (coordinator client, QUIC links, the stage worker); llama.cpp runs in the
worker's own engine thread. Results reach Qt through signals (queued across threads);
commands go in with `run_coroutine_threadsafe` (`AsyncThread.submit`).

The serving loop is the coordinated worker's own (`app.serving.coordinated.serve_coordinated`):
it reports each state through a callback and stops on an event, not a process signal.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import queue
import threading
from collections.abc import Callable, Coroutine
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

from PySide6.QtCore import QObject, Qt, Signal, Slot

from app.client.route import fetch_route
from app.identity import IDENTITY_FILE, Identity, coordinator_problem, join_swarm
from app.node_status import NodeStatus, ServeState, plain_reason, shown_while_pausing
from app.serving.coordinated import CoordinatedOptions
from app.serving.guest.loop import serve_as_guest
from app.serving.guest.policy import GuestSettings
from coordinator.client.session import check_invite
from coordinator.contract import InviteCheck
from coordinator.errors import CoordinatorError
from coordinator.invites import InviteCode, InviteError

log = logging.getLogger(__name__)

T = TypeVar("T")
RETRY_S = 5.0


# --- the background loop --------------------------------------------------------------


class AsyncThread:
    """One daemon thread running one asyncio loop until `stop()`."""

    def __init__(self, name: str = "sangama-async") -> None:
        self.loop = asyncio.new_event_loop()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()
        self._ready.wait()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.loop.call_soon(self._ready.set)
        self.loop.run_forever()
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.run_until_complete(self.loop.shutdown_default_executor())
        self.loop.close()

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        return asyncio.run_coroutine_threadsafe(coro, self.loop)

    def stop(self, timeout: float = 20.0) -> None:
        """Cancel every task, let each run its cleanup, then end the loop and the thread."""
        if not self._thread.is_alive():
            return

        async def _cancel_all() -> None:
            me = asyncio.current_task()
            tasks = [t for t in asyncio.all_tasks() if t is not me]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            asyncio.get_running_loop().stop()

        asyncio.run_coroutine_threadsafe(_cancel_all(), self.loop)
        self._thread.join(timeout)


class Mailbox(QObject):
    """Hands objects from any thread to a handler in this QObject's (the Qt) thread.

    Objects travel through a queue.Queue; the cross-thread signal itself carries no
    arguments (PySide6 6.12 corrupted reference counts of Python payloads in queued
    signals under load: "bool_dealloc" aborts)."""

    _wake = Signal()

    def __init__(self, handler: Callable[[object], None], parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._handler = handler
        self._items: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._wake.connect(self._drain, Qt.ConnectionType.QueuedConnection)

    def post(self, item: object) -> None:
        self._items.put(item)
        self._wake.emit()

    @Slot()
    def _drain(self) -> None:
        while True:
            try:
                item = self._items.get_nowait()
            except queue.Empty:
                return
            self._handler(item)


# --- node state -----------------------------------------------------------------------


def validate_code(code: str) -> str | None:
    """None when the code has a valid form, else why not (offline; the coordinator decides
    whether it is known, unused and unexpired)."""
    if not code.strip():
        return "Paste the invite code you were given."
    try:
        InviteCode.decode(code)
    except InviteError as exc:
        return plain_reason(exc)
    return None


def validate_coordinator(text: str) -> str | None:
    """None when `text` is empty (the coordinator the invite named) or a usable coordinator
    address, else why not (short: the settings dialog shows it under the address)."""
    if not text.strip():
        return None
    problem = coordinator_problem(text)
    return None if problem is None else f"This address {problem}."


class NodeController(QObject):
    """Joining, serving, pausing and resuming this PC's contribution."""

    status_changed = Signal(object)
    """NodeStatus, always emitted in the Qt thread."""
    join_finished = Signal(bool, str)
    """(ok, message): the node id on success, the coordinator's reason on failure."""
    code_checked = Signal(bool, str, str)
    """(valid, role, reason): the coordinator's answer to `check_code`, nothing used."""

    def __init__(
        self,
        runner: AsyncThread,
        options: CoordinatedOptions,
        parent: QObject | None = None,
        guest: GuestSettings | None = None,
    ) -> None:
        super().__init__(parent)
        self.runner = runner
        self.options = options
        self.guest = guest or GuestSettings()
        """When to step aside by itself (GPU busy, battery, quiet hours) and the caps."""
        self._task: concurrent.futures.Future[bool] | None = None
        self._stop: asyncio.Event | None = None
        self._restarting = False
        self._pause_asked = False
        """pause() was called and the loop has not ended yet (see shown_while_pausing)."""
        self._status = NodeStatus()
        self._mailbox = Mailbox(self._apply, self)
        self.invite_checker: Callable[[InviteCode], InviteCheck] = check_invite
        """Asks the code's coordinator whether it would accept the code (replaceable)."""
        if self.joined:
            self._status = NodeStatus(
                state=ServeState.PAUSED, node_id=str(self.identity_doc().get("node_id", ""))
            )

    @property
    def status(self) -> NodeStatus:
        return self._status

    @property
    def joined(self) -> bool:
        return (self.options.identity_dir / IDENTITY_FILE).exists()

    def identity_doc(self) -> dict[str, Any]:
        """identity.json (node id, role, the coordinator the invite named); {} if unreadable."""
        try:
            doc = json.loads((self.options.identity_dir / IDENTITY_FILE).read_text())
        except (OSError, ValueError):
            return {}
        return doc if isinstance(doc, dict) else {}

    @property
    def serving(self) -> bool:
        """A serve loop runs (serving, or on its way to it, or finishing sessions)."""
        return self._task is not None and not self._task.done()

    def _apply(self, item: object) -> None:
        # Everything from the loop thread arrives here, in the Qt thread (see Mailbox).
        if isinstance(item, _JoinResult):
            self.join_finished.emit(item.ok, item.message)
            return
        if isinstance(item, _CheckResult):
            self.code_checked.emit(item.check.valid, item.check.role, item.check.reason)
            return
        assert isinstance(item, NodeStatus)
        if self._pause_asked:
            if item.state in (ServeState.PAUSED, ServeState.ERROR, ServeState.NOT_JOINED):
                self._pause_asked = False
            else:
                item = shown_while_pausing(item, self._status)
        self._status = item
        self.status_changed.emit(item)

    def _report(self, status: NodeStatus) -> None:
        """Called from the loop thread (and download threads): hand over to Qt's thread."""
        self._mailbox.post(status)

    # --- commands (from the Qt thread) -------------------------------------------------

    def check_code(self, code: str) -> None:
        """Ask the code's coordinator whether it would accept the code now; the answer
        comes as `code_checked`. Nothing stops, nothing is used."""
        problem = validate_code(code)
        if problem is not None:
            self.code_checked.emit(False, "", problem)
            return
        self.runner.submit(self._check(code))

    async def _check(self, code: str) -> InviteCheck:
        loop = asyncio.get_running_loop()
        try:
            invite = InviteCode.decode(code)
            found = await loop.run_in_executor(None, self.invite_checker, invite)
        except Exception as exc:  # unreachable, an old coordinator: said, never raised
            found = InviteCheck(False, "", f"the code could not be checked: {plain_reason(exc)}")
        self._mailbox.post(_CheckResult(found))
        return found

    def join(self, code: str, vram_cap_bytes: int) -> None:
        """Join with an invite code (the path `sangama join` takes), then start serving.

        The code is checked with its coordinator before anything stops: a refused code
        leaves whatever ran before (serving, paused) as it was."""
        problem = validate_code(code)
        if problem is not None:
            self.join_finished.emit(False, problem)
            return
        before = self._status
        self._apply(replace(before, state=ServeState.JOINING, error=""))
        self.runner.submit(self._join(code, vram_cap_bytes, before))

    async def _join(self, code: str, vram_cap_bytes: int, before: NodeStatus) -> None:
        loop = asyncio.get_running_loop()
        was_serving = self.serving
        if was_serving or self.joined:
            # Leaving a swarm for a code that would be refused must not happen: ask first.
            check = await self._check_quietly(code)
            if not check.valid:
                log.info("join refused before leaving the swarm: %s", check.reason)
                self._report(before)
                self._from_join(False, check.reason)
                return
        try:
            # Joined elsewhere before? Stop that stage first: the identity is replaced.
            await self._stop_serving_here()
            identity = await loop.run_in_executor(None, join_swarm, code, self.options.identity_dir)
        except Exception as exc:  # every refusal is shown to the person, in words
            reason = plain_reason(exc)
            log.info("join refused: %s", reason)
            self._report(before)
            if was_serving and not self.serving:
                # Refused after the check said yes (used up meanwhile): the old identity
                # is untouched (it is replaced only on success), so serve with it again.
                self._start_serving()
            self._from_join(False, reason)
            return
        # Served before under another identity? That stage stops; the new one starts.
        await self._stop_serving_here()
        # The invite names the coordinator: an override for the old swarm no longer applies.
        self.options = replace(self.options, vram_cap_bytes=vram_cap_bytes, coordinator=None)
        self._from_join(True, identity.node_id)
        self._report(
            NodeStatus(
                state=ServeState.WAITING,
                node_id=identity.node_id,
                coordinator=identity.coordinator,
            )
        )
        self._start_serving()

    async def _check_quietly(self, code: str) -> InviteCheck:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(None, self.invite_checker, InviteCode.decode(code))
        except Exception as exc:
            return InviteCheck(False, "", f"the code could not be checked: {plain_reason(exc)}")

    async def _stop_serving_here(self) -> None:
        """In the loop: stop the serve loop (running sessions finish first) and wait."""
        task, stop = self._task, self._stop
        if task is None or task.done():
            return
        if stop is not None:
            stop.set()
        ended = asyncio.wrap_future(task)
        await asyncio.wait([ended], timeout=self.options.drain_s + 10)
        if not task.done():
            task.cancel()
            await asyncio.wait([ended], timeout=5)

    def _from_join(self, ok: bool, message: str) -> None:
        self._mailbox.post(_JoinResult(ok, message))

    def resume(self) -> None:
        if not self.joined:
            self._apply(NodeStatus(state=ServeState.NOT_JOINED))
            return
        if self.serving or self._restarting:
            return
        self._apply(replace(self._status, state=ServeState.WAITING, error=""))
        self._start_serving()

    def restart(self) -> None:
        """Serve again with the current options (e.g. another coordinator address): if
        serving, once running sessions have finished (as on pause); after an error, now."""
        if not self.serving:
            if self._status.state is ServeState.ERROR:
                self.resume()
            return

        async def again() -> None:
            try:
                await self._stop_serving_here()
                self._start_serving()
            finally:
                self._restarting = False

        # Until the new loop runs, Resume must not start a second one.
        self._restarting = True
        self.runner.submit(again())

    def _start_serving(self) -> None:
        self._pause_asked = False
        stop = asyncio.Event()
        guest = self.guest
        options = replace(
            self.options,
            download_bytes_per_s=guest.download_bytes_per_s,
            upload_bytes_per_s=guest.upload_bytes_per_s,
        )
        self._stop = stop

        async def run() -> bool:
            try:
                await serve_as_guest(options, guest, stop, self._report)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("serving failed")
                self._report(replace(self._status, state=ServeState.ERROR, error=plain_reason(exc)))
                return False
            return True  # only `stop` ends the loop: the stage is freed now

        def ended(task: concurrent.futures.Future[bool]) -> None:
            # PAUSED is reported once the task is done, never before: a window that sees
            # "paused" must also see `serving` false (posted from run() itself, the status
            # could reach the Qt thread while the future was still finishing).
            if not task.cancelled() and task.exception() is None and task.result():
                self._report(NodeStatus(state=ServeState.PAUSED, node_id=self._status.node_id))

        self._task = self.runner.submit(run())
        self._task.add_done_callback(ended)

    def pause(self) -> None:
        """Take no new sessions, let the running ones finish, then free the stage (memory,
        sockets); the identity stays. Returns at once: the state goes PAUSING (finishing
        N sessions), then PAUSED, so the UI never waits on a conversation."""
        task, stop = self._task, self._stop
        if task is None or task.done() or stop is None:
            state = ServeState.PAUSED if self.joined else ServeState.NOT_JOINED
            self._apply(NodeStatus(state=state, node_id=self._status.node_id))
            return
        self._pause_asked = True
        self._apply(replace(self._status, state=ServeState.PAUSING, finishing=0, error=""))
        self.runner.loop.call_soon_threadsafe(stop.set)

    def shutdown(self, timeout: float = 10.0) -> None:
        """Quit: stop serving, giving running sessions up to `timeout` s, then end them."""
        task = self._task
        if task is None or task.done():
            return
        if self._stop is not None:
            self.runner.loop.call_soon_threadsafe(self._stop.set)
        try:
            task.result(timeout)
        except (concurrent.futures.TimeoutError, TimeoutError):
            task.cancel()  # cancelling the serve loop still stops and frees the stage
        except (concurrent.futures.CancelledError, Exception):
            pass
        self._task = None


@dataclass(frozen=True)
class _JoinResult:
    ok: bool
    message: str


@dataclass(frozen=True)
class _CheckResult:
    check: InviteCheck


# --- the OpenAI-compatible API ------------------------------------------------------------


class ApiController(QObject):
    """The OpenAI-compatible API (`app.api.openai_api`, as `sangama api` serves it) on this
    PC's localhost, from the app's loop, as the joined identity; the port comes from the
    settings (0: off)."""

    changed = Signal()
    """`text` (and `url`) changed; emitted in the Qt thread."""

    def __init__(self, runner: AsyncThread, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.runner = runner
        self.url = ""
        """`http://127.0.0.1:PORT/v1` while listening, else ''."""
        self.text = "off"
        self._job: concurrent.futures.Future[None] | None = None
        self._stop: asyncio.Event | None = None
        self._mailbox = Mailbox(self._apply, self)

    def _apply(self, item: object) -> None:
        assert isinstance(item, tuple)
        self.url, self.text = item
        self.changed.emit()

    def serve(self, port: int, identity_dir: Path | None, coordinator: str | None = None) -> None:
        """(Re)start the API on `port` as the identity in `identity_dir` (None, or port 0:
        off). Returns at once; the old server stops first, in the loop."""
        previous, old_stop = self._job, self._stop
        if old_stop is not None:
            self.runner.loop.call_soon_threadsafe(old_stop.set)
        stop = self._stop = asyncio.Event()
        on = port > 0 and identity_dir is not None
        self._apply(("", f"starting on port {port}" if on else "off"))

        async def run() -> None:
            if previous is not None:  # the port is free again once it has stopped
                await asyncio.wait([asyncio.wrap_future(previous)])
            if on:
                assert identity_dir is not None
                await self._serve(port, identity_dir, coordinator, stop)

        self._job = self.runner.submit(run())

    async def _serve(
        self, port: int, identity_dir: Path, coordinator: str | None, stop: asyncio.Event
    ) -> None:
        from app.api.access import default_key_path  # FastAPI and uvicorn only when used
        from app.api.openai_serve import serve_identity

        loop = asyncio.get_running_loop()
        post = self._mailbox.post
        try:
            identity = await loop.run_in_executor(None, Identity.load, identity_dir)
            identity = identity.with_coordinator(coordinator)
            while True:  # just joined: placement may not have made a route yet
                try:
                    route, tokenizer_path = await loop.run_in_executor(None, fetch_route, identity)
                    break
                except CoordinatorError as exc:
                    post(("", f"waiting for a route ({plain_reason(exc)})"))
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), RETRY_S)
                if stop.is_set():
                    return

            key_path = default_key_path(identity.directory)

            def ready(bound: int) -> None:
                url = f"http://127.0.0.1:{bound}/v1"
                log.info("OpenAI-compatible API on %s (API key in %s)", url, key_path)
                post((url, f"{url} (API key in {key_path})"))

            await serve_identity(
                identity, route, tokenizer_path, "127.0.0.1", port, stop=stop, ready=ready
            )
            post(("", "off"))
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # e.g. the port is taken: said in the settings and status
            log.warning("the API stopped: %s", exc)
            post(("", f"error: {plain_reason(exc)}"))

    def shutdown(self, timeout: float = 8.0) -> None:
        job = self._job
        if self._stop is not None and self.runner.running:
            self.runner.loop.call_soon_threadsafe(self._stop.set)
        if job is not None:
            with contextlib.suppress(Exception):
                job.result(timeout)
