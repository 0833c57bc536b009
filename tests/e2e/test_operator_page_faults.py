"""The operator page shows a stage spot checks found faulty, with the evidence, and clears
it: a real `sangama coordinator` (three chains), six nodes answering a check's asks
through the volunteers' own client (coordinator/client/session.py), in a real browser."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from app.identity import Identity, join_swarm
from coordinator.contract import Heartbeat, HeartbeatAnswer
from coordinator.spot_checks import RECOMPUTE, RECORD, TOKENS, CheckRecord, CheckStep, digest
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.probe_answerer import HARDWARE, ProbeAnswerer
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.e2e

sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package")
expect = sync_api.expect

CHROMIUM = Path("/usr/bin/chromium")
PASSWORD = "correct horse battery staple"
SESSION = "s1"
ARGS = ["--max-chains", "3", "--spot-check-rate", "0", "--answer-probe-every", "0"]


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorProcess]:
    root = tmp_path_factory.mktemp("operator-page-faults")
    model = write_tiny_model(root / "tiny8.gguf", n_layer=8)
    with CoordinatorProcess.start(
        root / "data", model, password=PASSWORD, min_stages=2, extra_args=ARGS
    ) as coord:
        yield coord


def _beat(me: Identity, answerer: ProbeAnswerer) -> HeartbeatAnswer:
    beat = Heartbeat(
        address=answerer.address,
        capacity_bytes=8 << 30,
        hardware=HARDWARE,
        checkable=True,
        check_sessions=((SESSION, 1),),
    )
    return me.client().heartbeat(beat)


def _record(output: str) -> CheckRecord:
    rows = bytes(8)
    step = CheckStep(0, 0, 2, -1, 0, False, TOKENS, 0, 0, 1, rows, digest(rows), output)
    return CheckRecord(SESSION, (step,))


def test_a_faulty_stage_shows_with_its_evidence_and_is_cleared(
    coordinator: CoordinatorProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    chromium = shutil.which("chromium") or (str(CHROMIUM) if CHROMIUM.exists() else None)
    if chromium is None:
        pytest.skip("needs Debian's chromium (apt-get install chromium)")
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)

    answerers = [ProbeAnswerer() for _ in range(6)]
    try:
        nodes: dict[str, tuple[Identity, ProbeAnswerer]] = {}
        for i, answerer in enumerate(answerers):
            code = coordinator.admin.create_invite("worker")["code"]
            me = join_swarm(code, tmp_path / f"w{i}")
            nodes[me.node_id] = (me, answerer)
        for me, answerer in nodes.values():
            _beat(me, answerer)
        assignments = {n: _beat(me, a).assignment for n, (me, a) in nodes.items()}
        firsts = [n for n, a in assignments.items() if a is not None and a.layers[0] == 0]
        assert len(firsts) == 3, assignments
        checked = firsts[0]
        coordinator.admin.post(
            "/api/v1/checks", json={"node_id": checked, "session": SESSION, "steps": 1}
        )

        # The checked stage hands over its record; two holders recompute other rows.
        me, answerer = nodes[checked]
        (ask,) = _beat(me, answerer).check_asks
        assert ask.kind == RECORD
        claimed = digest(b"what it sent")
        me.client().answer_check(ask.check_id, {"record": _record(claimed).to_json()})
        theirs = digest(b"what the layers give")
        for _ in range(2):
            for holder in firsts[1:]:
                me, answerer = nodes[holder]
                for ask in _beat(me, answerer).check_asks:
                    assert ask.kind == RECOMPUTE
                    assert me.client().check_inputs(ask.check_id) == _record(claimed)
                    me.client().answer_check(ask.check_id, {"digests": [theirs]})
        assert checked in coordinator.admin.get("/api/v1/faults")["faulty"]

        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            try:
                context = browser.new_context(ignore_https_errors=True)
                context.set_default_timeout(20_000)
                page = context.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.on("dialog", lambda dialog: dialog.accept())
                page.goto(coordinator.url)
                page.get_by_test_id("login-password").fill(PASSWORD)
                page.get_by_test_id("login-submit").click()
                panel = page.get_by_test_id("faults-panel")
                expect(panel).to_be_visible()
                row = page.locator(f'[data-testid="fault-row"][data-node-id="{checked}"]')
                expect(row).to_contain_text("two other holders recomputed other rows")
                expect(row).to_contain_text(SESSION)
                expect(row).to_contain_text(claimed[:12])
                expect(row).to_contain_text(theirs[:12])
                event = page.locator(
                    f'[data-testid="event"][data-kind="faulty"][data-node-id="{checked}"]'
                )
                expect(event).to_have_count(1)
                row.get_by_test_id("fault-clear").click()
                expect(panel).to_be_hidden()
                assert not errors, f"JavaScript errors on the page: {errors}"
            finally:
                browser.close()
        assert coordinator.admin.get("/api/v1/faults")["faulty"] == {}
    finally:
        for answerer in answerers:
            answerer.close()
