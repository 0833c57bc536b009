"""The app serving a real coordinator's swarm (Gemma 3 270M, every layer on this PC): the
OpenAI-compatible API as a setting, driven by the official `openai` client, and a pause
that lets a running answer finish before the stage is freed.

The address kept with the identity leads nowhere (as if the coordinator had moved) and
the coordinator setting names the real one, so routes, chat and the API all work only
through that setting."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import openai
import pytest
from openai.types.chat import ChatCompletionMessageParam
from PySide6.QtWidgets import QApplication
from pytestqt.qtbot import QtBot

from app.identity import IDENTITY_FILE, join_swarm
from app.node_status import NodeStatus, ServeState
from app.ui.chat_controller import ChatStats
from app.ui.history import History
from app.ui.settings import Settings
from app.ui.tray import DesktopApp
from core.types import SamplingParams
from tests.support.coordinator_proc import CoordinatorProcess, free_port

pytestmark = [pytest.mark.ui, pytest.mark.integration]

STORY = [
    ("user", "Tell me a long story about a lighthouse keeper, a storm at sea and a lost ship.")
]
QUESTION: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Name three colours of the rainbow."}
]


def _wait(what: str, pred: Callable[[], bool], timeout: float) -> None:
    """qtbot.waitUntil for module fixtures (qtbot is per test)."""
    end = time.monotonic() + timeout
    while not pred():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        QApplication.processEvents()
        time.sleep(0.02)


@pytest.fixture(scope="module")
def coord(
    gemma_path: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[CoordinatorProcess]:
    # No answer probe: the pause test counts the sessions a paused node finishes, and
    # the probe's own sessions would be among them.
    c = CoordinatorProcess.start(
        tmp_path_factory.mktemp("coordinator"),
        gemma_path,
        min_stages=1,
        cut_pieces=False,
        extra_args=["--answer-probe-every", "0"],
    )
    yield c
    c.stop()


@pytest.fixture(scope="module")
def desk(
    qapp: QApplication, coord: CoordinatorProcess, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DesktopApp]:
    wd = tmp_path_factory.mktemp("app")
    with pytest.MonkeyPatch.context() as mp:
        for var in ("XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME", "XDG_CACHE_HOME"):
            mp.setenv(var, str(wd / var.lower()))
        identity_dir = wd / "identity"
        join_swarm(coord.admin.create_invite("worker")["code"], identity_dir)
        doc = json.loads((identity_dir / IDENTITY_FILE).read_text())
        doc["coordinator"] = f"https://127.0.0.1:{free_port()}"  # moved away from here
        (identity_dir / IDENTITY_FILE).write_text(json.dumps(doc))
        qapp.setQuitOnLastWindowClosed(False)
        d = DesktopApp(
            Settings(coordinator=coord.url),
            settings_dir=wd / "settings",
            identity_dir=identity_dir,
            history=History(wd / "chats"),
            tray_available=True,
        )
        try:
            # A hang guard, not a speed check: the download, the stage's assembly and two
            # reads of Gemma's GGUF header (before core/gguf_reader.py) took 174 s in a
            # clean-clone CI and more on a loaded 2-core machine.
            _wait("serving", lambda: d.node.status.state is ServeState.SERVING, 420)
            assert d.node.status.layers == (0, 18)
            yield d
        finally:
            d.quit()


def _set_api_port(desk: DesktopApp, port: int) -> None:
    dialog = desk.open_settings()
    dialog.api_port.setValue(port)
    dialog.save_button.click()
    assert desk.settings.api_port == port
    assert Settings.load(desk.settings_dir).api_port == port


def test_the_api_setting_serves_openai_clients_from_the_app(desk: DesktopApp, qtbot: QtBot) -> None:
    port = free_port()
    status = desk.open_status()
    assert status.fields["api"].text() == "off"
    _set_api_port(desk, port)
    url = f"http://127.0.0.1:{port}/v1"
    qtbot.waitUntil(lambda: desk.api.url == url, timeout=120000)
    # The status names where the API key is; the key is what OpenAI tools send.
    key_file = desk.node.options.identity_dir / "api-key"
    assert status.fields["api"].text() == f"{url} (API key in {key_file})"
    assert key_file.stat().st_mode & 0o777 == 0o600
    with pytest.raises(openai.AuthenticationError):
        openai.OpenAI(base_url=url, api_key="any", max_retries=0, timeout=30).models.list()

    client = openai.OpenAI(
        base_url=url, api_key=key_file.read_text().strip(), max_retries=0, timeout=120
    )
    (model,) = [m.id for m in client.models.list().data]
    whole = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=24, temperature=0
    )
    answer = whole.choices[0].message.content or ""
    assert answer.strip() and whole.usage is not None and whole.usage.completion_tokens > 1
    stream = client.chat.completions.create(
        model=model, messages=QUESTION, max_tokens=24, temperature=0, stream=True
    )
    streamed = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert len([p for p in streamed if p]) > 1  # pieces, not one block
    assert "".join(streamed) == answer  # greedy: the same answer either way

    # A port that is taken: the reason is shown, nothing crashes.
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        _set_api_port(desk, taken.getsockname()[1])
        qtbot.waitUntil(lambda: desk.api.text.startswith("error"), timeout=30000)
        assert "in use" in desk.api.text
        assert status.fields["api"].text() == desk.api.text

    # Off: the API stops listening.
    _set_api_port(desk, 0)
    qtbot.waitUntil(lambda: desk.api.text == "off", timeout=30000)
    with pytest.raises(openai.APIConnectionError):
        client.models.list()
    status.hide()


def test_pause_lets_a_running_answer_finish_then_frees_the_stage(
    desk: DesktopApp, qtbot: QtBot
) -> None:
    chat = desk.chat
    ended: list[object] = []  # ChatStats when finished, the reason when failed
    chat.finished.connect(ended.append)
    chat.failed.connect(ended.append)

    def ask(while_answering: Callable[[list[str]], None] | None = None) -> tuple[str, ChatStats]:
        qtbot.waitUntil(lambda: not chat.busy, timeout=10000)  # the last job has ended
        ended.clear()
        pieces: list[str] = []
        chat.text.connect(pieces.append)
        try:
            # Long enough that the pause lands well before the answer ends (after 5 pieces;
            # the node reports "finishing" a moment later): 80 tokens once ended first in
            # CI, and 160 on a machine decoding this model at ~60 tok/s.
            # Greedy with a repetition penalty: the same answer every run, and one that
            # does not loop (the chat's loop guard would end a looping one early).
            chat.send(STORY, SamplingParams(repetition_penalty=1.3), max_tokens=480)
            if while_answering is not None:
                while_answering(pieces)
            qtbot.waitUntil(lambda: bool(ended), timeout=180000)
        finally:
            chat.text.disconnect(pieces.append)
        (stats,) = ended
        assert isinstance(stats, ChatStats), f"the chat failed: {stats}"
        return "".join(pieces), stats

    reference, ref_stats = ask()
    assert ref_stats.tokens > 40 and not ref_stats.stopped, reference

    seen: list[tuple[NodeStatus, str]] = []

    def record(s: NodeStatus) -> None:
        assert desk.tray is not None
        seen.append((s, desk.tray.toolTip()))

    desk.node.status_changed.connect(record)
    address = desk.node.status.address

    def pause_mid_answer(pieces: list[str]) -> None:
        qtbot.waitUntil(lambda: len(pieces) > 5, timeout=60000)
        desk.toggle_pause()

    answer, stats = ask(pause_mid_answer)
    # The answer was not cut: the same tokens as without the pause, not an error.
    assert not stats.stopped and stats.tokens == ref_stats.tokens
    assert answer == reference
    pausing = [(s, tip) for s, tip in seen if s.state is ServeState.PAUSING and s.finishing]
    assert pausing, [s.state for s, _ in seen]  # it was still running when the pause began
    assert "finishing 1 session" in pausing[0][1]  # the tray's tooltip said so meanwhile

    qtbot.waitUntil(lambda: desk.node.status.state is ServeState.PAUSED, timeout=60000)
    assert not desk.node.serving
    # Once pausing, the tray never went back to "serving" before it said "paused" (a
    # heartbeat report made before the loop saw the stop used to overwrite it).
    states = [s.state for s, _ in seen]
    after = states[states.index(ServeState.PAUSING) :]
    assert ServeState.SERVING not in after[: after.index(ServeState.PAUSED)], states
    # The stage is freed: its UDP port can be taken again.
    host, port = address.rsplit(":", 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind((host, int(port)))
    desk.node.status_changed.disconnect(record)
    chat.finished.disconnect(ended.append)
    chat.failed.disconnect(ended.append)
