"""The desktop app's brains: QObjects with signals, and the one background asyncio thread.

DESIGN §8: the Qt main thread touches widgets only. One background thread owns the
asyncio loop (coordinator client, QUIC links, the stage worker); llama.cpp runs in the
worker's own engine thread. Results reach Qt through signals (queued across threads);
commands go in with `run_coroutine_threadsafe` (`AsyncThread.submit`).

The serving loop here is the coordinated worker's (`app.coordinated.run`), driven
step by step so the tray can show each state and stop it without process signals.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import enum
import logging
import queue
import threading
import time
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, TypeVar

from PySide6.QtCore import QObject, Qt, Signal, Slot

from app.client import SwarmClient
from app.config import Hop, Route, WorkerConfig, format_address, parse_address
from app.coordinated import _beat, _capacity, _renew_if_due, fetch_route, prepare_pieces
from app.identity import IDENTITY_FILE, Identity, default_identity_dir, join_swarm
from app.links import (
    LinkDialer,
    SignalRouter,
    advertised_candidates,
    channel_dialer,
    ice_config,
    serve_ice_offers,
)
from app.serve import start_worker
from coordinator.client import CoordinatorClient
from coordinator.downloads import DownloadProgress
from coordinator.errors import CoordinatorError
from coordinator.invites import InviteCode, InviteError
from core.tokenizer import Tokenizer
from core.types import LayerRange, SamplingParams
from net.channel import NodeCredentials
from net.quic import QuicTuning

log = logging.getLogger(__name__)

T = TypeVar("T")
HEARTBEAT_S = 2.0
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


class ServeState(enum.Enum):
    NOT_JOINED = "not joined"
    JOINING = "joining"
    WAITING = "waiting for a stage"
    DOWNLOADING = "downloading"
    LOADING = "loading"
    SERVING = "serving"
    PAUSED = "paused"
    ERROR = "error"


@dataclass(frozen=True)
class NodeStatus:
    state: ServeState = ServeState.NOT_JOINED
    node_id: str = ""
    coordinator: str = ""
    progress: float = 0.0
    """0..1 while downloading."""
    layers: tuple[int, int] | None = None
    model: str = ""
    address: str = ""
    next_hop: str = ""
    """'node at address (path)', or '' on the last stage."""
    sessions: int = 0
    steps: int = 0
    errors: int = 0
    throughput: float = 0.0
    """Tokens (rows) per second through this stage over the last heartbeat."""
    compute_ms: float = 0.0
    rtt_ms: float | None = None
    error: str = ""
    """Plain-words reason, in state ERROR."""
    started_at: float = field(default_factory=time.time)

    @property
    def summary(self) -> str:
        """One line: the tray tooltip."""
        s = self.state
        if s is ServeState.DOWNLOADING:
            return f"Sangama: downloading ({self.progress * 100:.0f}%)"
        if s is ServeState.SERVING and self.layers is not None:
            a, b = self.layers
            n = self.sessions
            return f"Sangama: serving layers {a}-{b - 1} ({n} session{'' if n == 1 else 's'})"
        if s is ServeState.ERROR:
            return f"Sangama: error: {self.error}"
        return f"Sangama: {s.value}"


def plain_reason(exc: BaseException) -> str:
    """An exception as words for a person: the coordinator's reason, not a traceback."""
    text = str(exc).strip()
    if isinstance(exc, InviteError | CoordinatorError) and text:
        return text[0].upper() + text[1:]
    if isinstance(exc, OSError):
        return f"System error: {text or type(exc).__name__}"
    return text or type(exc).__name__


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


# --- serving -----------------------------------------------------------------------------


@dataclass(frozen=True)
class ServeOptions:
    identity_dir: Path = field(default_factory=default_identity_dir)
    listen_host: str = "127.0.0.1"
    advertise: str | None = None
    vram_cap_bytes: int = 0
    threads: int = 1
    max_sessions: int = 8
    relay_only: bool = False


async def contribute(
    options: ServeOptions, report: Callable[[NodeStatus], None], stop: asyncio.Event
) -> None:
    """The coordinated worker loop (`app.coordinated.run`) with states reported as it goes.

    Returns when `stop` is set; cancelling the task stops and frees the stage too."""
    loop = asyncio.get_running_loop()
    identity = await loop.run_in_executor(None, Identity.load, options.identity_dir)
    base = NodeStatus(node_id=identity.node_id, coordinator=identity.coordinator)
    report(replace(base, state=ServeState.WAITING))
    client = identity.client()
    from app.local_swarm import free_udp_port

    host = options.listen_host
    port = free_udp_port(host)
    address = options.advertise or format_address((host, port))
    capacity, hardware = await loop.run_in_executor(None, _capacity, options.vram_cap_bytes)
    report_doc: dict[str, Any] = {
        "address": address,
        "capacity_bytes": capacity,
        "vram_cap_bytes": options.vram_cap_bytes,
        "hardware": hardware,
    }
    while not stop.is_set():
        assignment = await _wait_for_assignment(client, report_doc, stop, report, base)
        if assignment is None:
            return
        layers = LayerRange(*assignment["layers"])
        status = replace(
            base,
            state=ServeState.DOWNLOADING,
            layers=(layers.start, layers.stop),
            model=str(assignment["model"]),
            address=address,
        )
        report(status)

        def on_progress(p: DownloadProgress, status: NodeStatus = status) -> None:
            fraction = p.all_done_bytes / p.all_total_bytes if p.all_total_bytes else 1.0
            report(replace(status, progress=min(1.0, fraction)))

        pieces_dir = await prepare_pieces(identity, client, assignment, on_progress)
        report(replace(status, state=ServeState.LOADING, progress=1.0))
        hop = assignment.get("next_hop")
        config = WorkerConfig(
            node_id=identity.node_id,
            listen=(host, port),
            model=str(pieces_dir),
            layers=layers,
            credentials=identity.directory,
            next_hop=Hop(hop["node_id"], parse_address(hop["address"])) if hop else None,
            threads=options.threads,
            max_sessions=options.max_sessions,
        )
        creds = identity.credentials()
        ice = await loop.run_in_executor(
            None, ice_config, client, advertised_candidates(options.advertise)
        )
        if options.relay_only:
            ice = ice.with_relay_only()
        router = SignalRouter(client)
        link_dialer = LinkDialer(creds, router, ice, QuicTuning(), direct=not options.relay_only)
        worker = await start_worker(config, creds, link_dialer.dial_with_path)
        try:
            serve_ice_offers(router, worker.server, ice)
            router.start()
            hop_text = f"{hop['node_id']} at {hop['address']}" if hop else ""
            serving = replace(status, state=ServeState.SERVING, progress=1.0, next_hop=hop_text)
            report(serving)
            log.info("serving layers %s as %s on %s", layers, identity.node_id, address)
            last_rows, last_t = 0, time.monotonic()
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), HEARTBEAT_S)
                    break
                stats = worker.stats
                identity = await _renew_if_due(identity, client, worker)
                rtt = await worker.next_hop_rtt()
                now = time.monotonic()
                rate = (stats.rows - last_rows) / max(now - last_t, 1e-6)
                rtt_ms = next(iter(rtt.values()), None)
                beat_report = {
                    **report_doc,
                    "rtt_ms": rtt,
                    "path": worker.next_hop_path,
                    "tokens": stats.tokens,
                    "compute_ms": stats.last_compute_ms,
                    "stats": {
                        "compute_ms": stats.last_compute_ms,
                        "steps": stats.steps,
                        "sessions": stats.sessions_opened,
                        "errors": stats.errors,
                        "rtt_ms": rtt_ms,
                    },
                }
                last_rows, last_t = stats.rows, now
                path = worker.next_hop_path if hop else ""
                report(
                    replace(
                        serving,
                        sessions=stats.sessions_opened,
                        steps=stats.steps,
                        errors=stats.errors,
                        throughput=rate,
                        compute_ms=stats.last_compute_ms,
                        rtt_ms=rtt_ms,
                        next_hop=f"{hop_text} ({path})" if hop else "",
                    )
                )
                try:
                    beat = await loop.run_in_executor(None, _beat, client, beat_report)
                except CoordinatorError as exc:
                    log.warning("heartbeat failed: %s", exc)
                    continue
                worker.set_revoked(frozenset(int(s) for s in beat.get("revoked_serials", [])))
                if beat.get("assignment") != assignment:
                    log.info("assignment changed; rebuilding the stage")
                    break
        finally:
            await router.stop()
            await worker.stop()


async def _wait_for_assignment(
    client: CoordinatorClient,
    report_doc: dict[str, Any],
    stop: asyncio.Event,
    report: Callable[[NodeStatus], None],
    base: NodeStatus,
) -> dict[str, Any] | None:
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        try:
            beat = await loop.run_in_executor(None, lambda: client.heartbeat(**report_doc))
            if beat.get("assignment"):
                return dict(beat["assignment"])
            report(replace(base, state=ServeState.WAITING))
        except CoordinatorError as exc:
            log.warning("coordinator: %s", exc)
            report(replace(base, state=ServeState.WAITING, error=plain_reason(exc)))
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), HEARTBEAT_S)
    return None


class NodeController(QObject):
    """Joining, serving, pausing and resuming this PC's contribution."""

    status_changed = Signal(object)
    """NodeStatus, always emitted in the Qt thread."""
    join_finished = Signal(bool, str)
    """(ok, message): the node id on success, the coordinator's reason on failure."""

    def __init__(
        self, runner: AsyncThread, options: ServeOptions, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self.runner = runner
        self.options = options
        self._task: concurrent.futures.Future[None] | None = None
        self._async_task: asyncio.Task[Any] | None = None
        self._stop: asyncio.Event | None = None
        self._status = NodeStatus()
        self._mailbox = Mailbox(self._apply, self)
        if self.joined:
            identity_doc = (options.identity_dir / IDENTITY_FILE).read_text()
            self._status = NodeStatus(state=ServeState.PAUSED, node_id=_node_id(identity_doc))

    @property
    def status(self) -> NodeStatus:
        return self._status

    @property
    def joined(self) -> bool:
        return (self.options.identity_dir / IDENTITY_FILE).exists()

    @property
    def serving(self) -> bool:
        return self._task is not None and not self._task.done()

    def _apply(self, item: object) -> None:
        # Everything from the loop thread arrives here, in the Qt thread (see Mailbox).
        if isinstance(item, _JoinResult):
            self.join_finished.emit(item.ok, item.message)
            return
        assert isinstance(item, NodeStatus)
        self._status = item
        self.status_changed.emit(item)

    def _report(self, status: NodeStatus) -> None:
        """Called from the loop thread (and download threads): hand over to Qt's thread."""
        self._mailbox.post(status)

    # --- commands (from the Qt thread) -------------------------------------------------

    def join(self, code: str, vram_cap_bytes: int) -> None:
        """Join with an invite code (the path `sangama join` takes), then start serving.

        A refused code leaves whatever ran before (serving, paused) as it was."""
        problem = validate_code(code)
        if problem is not None:
            self.join_finished.emit(False, problem)
            return
        before = self._status
        self._apply(replace(before, state=ServeState.JOINING, error=""))
        self.runner.submit(self._join(code, vram_cap_bytes, before))

    async def _join(self, code: str, vram_cap_bytes: int, before: NodeStatus) -> None:
        loop = asyncio.get_running_loop()
        try:
            # Joined elsewhere before? Stop that stage first: the identity is replaced.
            await self._stop_serving_here()
            identity = await loop.run_in_executor(None, join_swarm, code, self.options.identity_dir)
        except Exception as exc:  # every refusal is shown to the person, in words
            reason = plain_reason(exc)
            log.info("join refused: %s", reason)
            self._report(before)
            self._from_join(False, reason)
            return
        # Served before under another identity? That stage stops; the new one starts.
        await self._stop_serving_here()
        self.options = replace(self.options, vram_cap_bytes=vram_cap_bytes)
        self._from_join(True, identity.node_id)
        self._report(
            NodeStatus(
                state=ServeState.WAITING,
                node_id=identity.node_id,
                coordinator=identity.coordinator,
            )
        )
        self._start_serving()

    async def _stop_serving_here(self) -> None:
        task = self._async_task
        if task is None or task.done():
            return
        if self._stop is not None:
            self._stop.set()
        await asyncio.wait([task], timeout=20)
        if not task.done():
            task.cancel()
            await asyncio.wait([task], timeout=5)

    def _from_join(self, ok: bool, message: str) -> None:
        self._mailbox.post(_JoinResult(ok, message))

    def resume(self) -> None:
        if not self.joined:
            self._apply(NodeStatus(state=ServeState.NOT_JOINED))
            return
        if self.serving:
            return
        self._apply(replace(self._status, state=ServeState.WAITING, error=""))
        self._start_serving()

    def _start_serving(self) -> None:
        async def run() -> None:
            self._stop = asyncio.Event()
            self._async_task = asyncio.current_task()
            try:
                await contribute(self.options, self._report, self._stop)
            except asyncio.CancelledError:
                raise
            except Exception as exc:
                log.exception("serving failed")
                self._report(replace(self._status, state=ServeState.ERROR, error=plain_reason(exc)))

        self._task = self.runner.submit(run())

    def pause(self, report: bool = True, timeout: float = 20.0) -> None:
        """Stop serving and free the stage (memory, sockets); the identity stays."""
        task = self._task
        if task is not None and not task.done():
            stop = self._stop
            if stop is not None:
                self.runner.loop.call_soon_threadsafe(stop.set)
            try:
                task.result(timeout)
            except (concurrent.futures.TimeoutError, TimeoutError):
                task.cancel()
            except (concurrent.futures.CancelledError, Exception):
                pass
        self._task = None
        if report:
            state = ServeState.PAUSED if self.joined else ServeState.NOT_JOINED
            self._apply(NodeStatus(state=state, node_id=self._status.node_id))

    def shutdown(self) -> None:
        self.pause(report=False)


@dataclass(frozen=True)
class _JoinResult:
    ok: bool
    message: str


def _node_id(identity_json: str) -> str:
    import json

    try:
        return str(json.loads(identity_json)["node_id"])
    except (ValueError, KeyError, TypeError):
        return ""


# --- chat ------------------------------------------------------------------------------


@dataclass
class ChatConnection:
    client: SwarmClient
    tokenizer: Tokenizer
    stages: int
    closers: list[Callable[[], Awaitable[None]]] = field(default_factory=list)

    async def close(self) -> None:
        with contextlib.suppress(Exception):
            await self.client.close()
        for close in self.closers:
            with contextlib.suppress(Exception):
                await close()
        self.tokenizer.close()


ChatConnector = Callable[[], Awaitable[ChatConnection]]


def identity_connector(identity_dir: Path) -> ChatConnector:
    """Chat through the swarm this PC joined: route from the coordinator, ICE links."""

    async def connect() -> ChatConnection:
        loop = asyncio.get_running_loop()
        identity = await loop.run_in_executor(None, Identity.load, identity_dir)
        route, tokenizer_path = await loop.run_in_executor(None, fetch_route, identity)
        from app.links import start_links

        link_dialer, router = await start_links(
            identity.client(), identity.credentials(), QuicTuning()
        )
        tokenizer = await loop.run_in_executor(None, Tokenizer.from_gguf, tokenizer_path)
        client = SwarmClient(identity.credentials(), route, dialer=channel_dialer(link_dialer))
        conn = ChatConnection(client, tokenizer, len(route.stages), [router.stop])
        try:
            await client.connect()
        except BaseException:
            await conn.close()
            raise
        return conn

    return connect


def direct_connector(
    creds: NodeCredentials, route: Route, tokenizer_gguf: Path, tuning: QuicTuning = QuicTuning()
) -> ChatConnector:
    """Chat over a known route with direct links (a loopback swarm, tests)."""

    async def connect() -> ChatConnection:
        loop = asyncio.get_running_loop()
        tokenizer = await loop.run_in_executor(None, Tokenizer.from_gguf, tokenizer_gguf)
        client = SwarmClient(creds, route, tuning)
        conn = ChatConnection(client, tokenizer, len(route.stages))
        try:
            await client.connect()
        except BaseException:
            await conn.close()
            raise
        return conn

    return connect


@dataclass(frozen=True)
class ChatStats:
    tokens: int
    first_token_ms: float
    tokens_per_s: float
    stages: int
    stopped: bool = False


class ChatController(QObject):
    """One chat at a time through the swarm; tokens stream back as signals."""

    text = Signal(str)
    """A piece of the answer (decoded, UTF-8 safe)."""
    finished = Signal(object)
    """ChatStats, also after Stop."""
    failed = Signal(str)
    busy_changed = Signal(bool)

    def __init__(
        self, runner: AsyncThread, connector: ChatConnector | None, parent: QObject | None = None
    ) -> None:
        super().__init__(parent)
        self._mailbox = Mailbox(self._dispatch, self)
        self.runner = runner
        self.connector = connector
        self._conn: ChatConnection | None = None
        self._job: concurrent.futures.Future[None] | None = None

    @property
    def busy(self) -> bool:
        return self._job is not None and not self._job.done()

    def _dispatch(self, item: object) -> None:
        """Loop-thread events, re-emitted in the Qt thread as the public signals."""
        assert isinstance(item, tuple)
        kind, value = item
        if kind == "text":
            self.text.emit(value)
        elif kind == "finished":
            self.finished.emit(value)
        elif kind == "failed":
            self.failed.emit(value)
        elif kind == "idle":
            self.busy_changed.emit(self.busy)

    def set_connector(self, connector: ChatConnector | None) -> None:
        self.connector = connector
        conn, self._conn = self._conn, None
        if conn is not None:
            self.runner.submit(conn.close())

    def send(
        self,
        messages: Sequence[tuple[str, str]],
        sampling: SamplingParams = SamplingParams(),
        max_tokens: int = 256,
    ) -> None:
        if self.busy:
            return
        if self.connector is None:
            self.failed.emit("Not connected to a swarm: join one first (tray menu, Join a swarm).")
            return
        self.busy_changed.emit(True)
        job = self.runner.submit(self._generate(list(messages), sampling, max_tokens))
        job.add_done_callback(lambda _f: self._mailbox.post(("idle", None)))
        self._job = job

    def stop(self) -> None:
        if self._job is not None:
            self._job.cancel()

    async def _generate(
        self, messages: list[tuple[str, str]], sampling: SamplingParams, max_tokens: int
    ) -> None:
        t0 = time.perf_counter()
        first_ms = 0.0
        t_first = t0
        n = 0
        stages = 0
        try:
            if self._conn is None:
                assert self.connector is not None
                self._conn = await self.connector()
            conn = self._conn
            stages = conn.stages
            tok = conn.tokenizer
            ids = _encode(tok, messages)
            streamer = tok.streamer()
            async for ev in conn.client.generate(ids, max_tokens, sampling, is_end=tok.is_end):
                for t in ev.tokens:
                    if n == 0:
                        t_first = time.perf_counter()
                        first_ms = (t_first - t0) * 1e3
                    n += 1
                    if not tok.is_end(t):
                        piece = streamer.push(t)
                        if piece:
                            self._mailbox.post(("text", piece))
            rest = streamer.flush()
            if rest:
                self._mailbox.post(("text", rest))
            self._mailbox.post(("finished", ChatStats(n, first_ms, _rate(n, t_first), stages)))
        except asyncio.CancelledError:
            stats = ChatStats(n, first_ms, _rate(n, t_first), stages, stopped=True)
            self._mailbox.post(("finished", stats))
            raise
        except Exception as exc:
            log.warning("chat failed: %s", exc)
            conn_, self._conn = self._conn, None
            if conn_ is not None:
                await conn_.close()
            self._mailbox.post(("failed", plain_reason(exc)))

    def shutdown(self) -> None:
        self.stop()
        conn, self._conn = self._conn, None
        if conn is not None and self.runner.running:
            with contextlib.suppress(Exception):
                self.runner.submit(conn.close()).result(5)


def _encode(tok: Tokenizer, messages: list[tuple[str, str]]) -> list[int]:
    """The conversation in the model's chat template; plain text where it has none
    (llama.cpp's fallback template can abort on tiny vocabularies)."""
    if tok.chat_template():
        return tok.encode_chat(messages)
    return tok.encode("\n".join(text for _r, text in messages))


def _rate(n: int, t_first: float) -> float:
    elapsed = time.perf_counter() - t_first
    return (n - 1) / elapsed if n > 1 and elapsed > 0 else 0.0
