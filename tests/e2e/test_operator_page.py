"""The operator page in a real browser against a real `sangama coordinator` process.

Sign in (a wrong password first), create a worker invite in the page, join a node with
the code the page shows, heartbeat once, and watch the swarm table, the coverage bar and
the stage timings follow; revoke the invite and the node from the page; log out.
Screenshots go to artifacts/operator-page.png (and -narrow.png for a phone-sized view).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.contract import Heartbeat
from tests.support.coordinator_proc import REPO_ROOT, CoordinatorProcess
from tests.support.probe_answerer import HARDWARE, ProbeAnswerer
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.e2e

sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package")
expect = sync_api.expect

CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
PASSWORD = "correct horse battery staple"
N_LAYER = 8
ARTIFACTS = REPO_ROOT / "artifacts"
TIMEOUT_MS = 20_000


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorProcess]:
    root = tmp_path_factory.mktemp("operator-page")
    model = write_tiny_model(root / "tiny-llama.gguf", n_layer=N_LAYER)
    with CoordinatorProcess.start(root / "data", model, password=PASSWORD, min_stages=1) as coord:
        yield coord
        print(f"coordinator output:\n{coord.output()}")  # shown by pytest when a test failed


@pytest.fixture
def browser_page(coordinator: CoordinatorProcess) -> Iterator[Any]:
    chromium = shutil.which("chromium") or (str(CHROMIUM) if CHROMIUM.exists() else None)
    if chromium is None:
        pytest.skip("needs Debian's chromium (apt-get install chromium)")
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=chromium, args=CHROMIUM_ARGS)
        try:
            # The page is served with a certificate from the swarm CA, unknown to the browser.
            context = browser.new_context(
                ignore_https_errors=True, viewport={"width": 1360, "height": 900}
            )
            context.grant_permissions(["clipboard-read", "clipboard-write"], origin=coordinator.url)
            context.set_default_timeout(TIMEOUT_MS)
            page = context.new_page()
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            yield page
            assert not errors, f"JavaScript errors on the page: {errors}"
        finally:
            browser.close()


_answerer: ProbeAnswerer | None = None


def _node_heartbeat(identity: Any, **extra: Any) -> dict[str, Any]:
    """The heartbeat answer as the JSON it travelled as (lists, not the client's tuples)."""
    global _answerer
    if _answerer is None:  # the coordinator places only addresses that answer its probe
        _answerer = ProbeAnswerer()
    beat = Heartbeat(
        address=_answerer.address,
        capacity_bytes=8 << 30,
        vram_cap_bytes=0,
        **{"hardware": HARDWARE, **extra},
    )
    answer = identity.client().heartbeat(beat)
    result: dict[str, Any] = json.loads(json.dumps(dataclasses.asdict(answer)))
    return result


def test_operator_page_flow(
    coordinator: CoordinatorProcess,
    browser_page: Any,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from app.identity import join_swarm

    # requests lets these override a Session's `verify` (the node client pins the swarm CA
    # that way); unset so the node below talks TLS with its own CA whatever the machine sets.
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)

    page = browser_page
    tid = page.get_by_test_id
    page.goto(coordinator.url)

    # -- sign in: the server's message on a wrong password, then the dashboard
    expect(tid("login-form")).to_be_visible()
    tid("login-password").fill("not the password")
    tid("login-submit").click()
    expect(tid("login-error")).to_have_text("wrong operator password")
    tid("login-password").fill(PASSWORD)
    tid("login-submit").click()
    expect(tid("swarm-table")).to_be_visible()
    expect(tid("model-name")).to_have_text("tiny-llama")
    expect(tid("plan-error")).to_be_visible()  # no worker yet, so no plan
    expect(tid("coverage-gap")).to_have_count(1)
    summary = tid("coverage-summary")
    expect(summary).to_have_text(f"0 of {N_LAYER} layers covered, {N_LAYER} missing")

    # -- create a worker invite in the page and read its code from the page
    form = tid("invite-form")
    tid("invite-role").select_option("worker")
    tid("invite-uses").fill("2")
    tid("invite-expires").fill("2h")
    tid("invite-note").fill("<b>rack 3</b>")
    tid("invite-create").click()
    code_box = tid("invite-code")
    expect(code_box).to_have_value(re.compile(r"^sangama1-[A-Za-z0-9_-]+$"))
    code = code_box.input_value()
    # The hint is the command a volunteer runs for this role, again after a restart.
    expect(tid("new-code-command")).to_have_text("sangama worker --join CODE")
    tid("invite-copy").click()
    expect(tid("copied")).to_be_visible()
    assert page.evaluate("navigator.clipboard.readText()") == code

    invite_row = tid("invite-row").filter(has_text="rack 3")
    expect(invite_row).to_have_count(1)
    expect(invite_row.get_by_test_id("invite-status")).to_have_text("active")
    expect(invite_row.get_by_test_id("invite-uses-left")).to_have_text("2 / 2")
    # The note is shown as text, never parsed as markup.
    expect(invite_row.locator("td.invite-note")).to_have_text("<b>rack 3</b>")
    expect(invite_row.locator("b")).to_have_count(0)
    expect(form.get_by_test_id("invite-error")).to_be_hidden()

    # -- a node joins with that code and reports once
    identity = join_swarm(code, tmp_path / "node")
    assert identity.role == "worker"
    beat = _node_heartbeat(
        identity,
        tokens=48,
        compute_ms=12.5,
        stats={"compute_ms": 12.5, "steps": 48, "sessions": 1, "errors": 0},
        backend=f"Vulkan0 (NVIDIA GeForce RTX 4090), 6/{N_LAYER} layers",
        device_bytes_used=3 << 30,
        device_cap_bytes=8 << 30,
        gpu_layers=6,
        n_layers=N_LAYER,
        step_ms=((1, 12.5), (16, 40.0)),
        row_budget=16,
    )
    assert beat["assignment"]["layers"] == [0, N_LAYER]

    row = page.locator(f'[data-testid="node-row"][data-node-id="{identity.node_id}"]')
    expect(row).to_be_visible()
    expect(row.get_by_test_id("node-role")).to_have_text("worker")
    # Named by its invite's note, shown as text, never parsed as markup.
    expect(row.get_by_test_id("node-name")).to_have_text("<b>rack 3</b>")
    expect(row.locator("b")).to_have_count(0)
    expect(row.get_by_test_id("node-health")).to_have_text("healthy")
    expect(row.get_by_test_id("node-layers")).to_have_text(f"0-{N_LAYER - 1} ({N_LAYER})")
    expect(row.get_by_test_id("node-capacity")).to_have_text("8.0 GiB")
    assert _answerer is not None
    expect(row.get_by_test_id("node-address")).to_have_text(_answerer.address)
    expect(row.get_by_test_id("node-path")).to_have_text("direct")
    expect(row.get_by_test_id("node-backend")).to_have_text(
        f"Vulkan0 (NVIDIA GeForce RTX 4090), 6/{N_LAYER} layers"
    )
    expect(row.get_by_test_id("node-device-memory")).to_have_text("3.0 / 8.0 GiB device memory")
    expect(row.get_by_test_id("node-gpu-layers")).to_have_text(f"6/{N_LAYER} layers on GPU")

    segment = tid("coverage-segment")
    expect(segment).to_have_count(1)
    expect(segment).to_have_attribute("data-node-id", identity.node_id)
    expect(segment).to_have_attribute("data-start", "0")
    expect(segment).to_have_attribute("data-stop", str(N_LAYER))
    expect(tid("coverage-gap")).to_have_count(0)
    expect(summary).to_have_text(f"all {N_LAYER} layers covered by 1 stage")
    expect(tid("plan-error")).to_be_hidden()

    timing = page.locator(f'[data-testid="stage-timing"][data-node-id="{identity.node_id}"]')
    expect(timing.get_by_test_id("stage-ms")).to_have_text("12.5 ms")
    # Predicted: one stage of 12.5 ms a row, its ring link to itself, one hop of 0.5 ms
    # + 0.2 ms a row (coordinator/server/prediction.py): 1000 / 13.2 = 75.8 tokens/s;
    # 16 at once step in 40 ms: 16000 / (40 + 0.5 + 3.2) = 366 tokens/s.
    expect(tid("stat-predicted")).to_have_text("75.8")
    level = page.locator('[data-testid="prediction-row"][data-requests="16"]')
    expect(level.get_by_test_id("prediction-total")).to_have_text("366")
    expect(tid("prediction-summary")).to_contain_text("one request: 75.8 tokens/s")
    expect(tid("throughput-total")).to_have_text("48 tokens in 30 min")
    expect(invite_row.get_by_test_id("invite-uses-left")).to_have_text("1 / 2")

    ARTIFACTS.mkdir(exist_ok=True)
    page.evaluate("window.scrollTo(0, 0)")
    page.screenshot(path=str(ARTIFACTS / "operator-page.png"), full_page=True)
    page.set_viewport_size({"width": 420, "height": 900})
    expect(row).to_be_attached()
    page.screenshot(path=str(ARTIFACTS / "operator-page-narrow.png"), full_page=True)
    page.set_viewport_size({"width": 1360, "height": 900})

    # -- revoke the invite from the page
    page.once("dialog", lambda dialog: dialog.accept())
    invite_row.get_by_test_id("invite-revoke").click()
    expect(invite_row.get_by_test_id("invite-status")).to_have_text("revoked")
    expect(invite_row.get_by_test_id("invite-revoke")).to_be_hidden()
    listed = {i["id"]: i for i in coordinator.admin.get("/api/v1/invites")}
    assert any(i["revoked"] and i["note"] == "<b>rack 3</b>" for i in listed.values())

    # -- revoking a node asks first; dismissing keeps it
    page.once("dialog", lambda dialog: dialog.dismiss())
    row.get_by_test_id("node-revoke").click()
    expect(row.get_by_test_id("node-health")).not_to_have_text("revoked")
    expect(row.get_by_test_id("node-revoke")).to_be_visible()
    page.once("dialog", lambda dialog: dialog.accept())
    row.get_by_test_id("node-revoke").click()
    expect(row.get_by_test_id("node-health")).to_have_text("revoked")
    expect(row.get_by_test_id("node-revoke")).to_be_hidden()
    expect(tid("plan-error")).to_be_visible()
    expect(tid("coverage-gap")).to_have_count(1)

    # -- log out: back to the sign-in form, and the API no longer answers this browser
    tid("logout").click()
    expect(tid("login-form")).to_be_visible()
    status = page.evaluate("fetch('/api/v1/swarm').then(r => r.status)")
    assert status == 401


def test_three_stage_swarm_renders(
    tmp_path_factory: pytest.TempPathFactory, browser_page: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three workers, --min-stages 3: three coloured segments meet end to end over all layers."""
    from app.identity import join_swarm

    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    root = tmp_path_factory.mktemp("three-stages")
    model = write_tiny_model(root / "tiny-llama.gguf", n_layer=N_LAYER)
    with CoordinatorProcess.start(root / "data", model, password=PASSWORD, min_stages=3) as coord:
        code = coord.admin.create_invite("worker", uses=3)["code"]
        nodes = [join_swarm(code, root / f"node{i}") for i in range(3)]
        for i, identity in enumerate(nodes):
            stats = {"compute_ms": 4.0 + 3 * i, "steps": 10} if i != 1 else {}
            # The middle node serves nothing yet: no backend to show.
            compute = {"backend": "CPU (haswell)", "n_layers": 3} if i != 1 else {}
            _node_heartbeat(identity, tokens=10 * (i + 1), stats=stats, **compute)

        page = browser_page
        tid = page.get_by_test_id
        page.goto(coord.url)
        tid("login-password").fill(PASSWORD)
        tid("login-submit").click()

        segments = tid("coverage-segment")
        expect(segments).to_have_count(3)
        expect(tid("coverage-gap")).to_have_count(0)
        expect(tid("stat-stages")).to_have_text("3")
        bounds = [
            (int(s.get_attribute("data-start") or -1), int(s.get_attribute("data-stop") or -1))
            for s in segments.all()
        ]
        assert bounds[0][0] == 0 and bounds[-1][1] == N_LAYER
        assert all(a[1] == b[0] for a, b in itertools.pairwise(bounds))
        holders = {s.get_attribute("data-node-id") for s in segments.all()}
        assert holders == {n.node_id for n in nodes}
        expect(tid("stage-timing")).to_have_count(3)
        expect(tid("stage-ms").filter(has_text="no data")).to_have_count(1)
        expect(tid("node-health").filter(has_text="healthy")).to_have_count(3)
        expect(tid("node-backend").filter(has_text="CPU (haswell)")).to_have_count(2)
        expect(tid("node-backend").filter(has_text="—")).to_have_count(1)
        expect(tid("node-gpu-layers").filter(has_text="0/3 layers on GPU")).to_have_count(2)

        # Every layer covered, every node healthy, and still no answer: these nodes
        # heartbeat but serve nothing, which only the coordinator's own two-token probe
        # of the chain finds (coordinator/server/answer_prober.py).
        first = bounds[0]
        first_node = next(
            s.get_attribute("data-node-id")
            for s in segments.all()
            if int(s.get_attribute("data-start") or -1) == first[0]
        )
        answer = tid("answer")
        # The first probe dials the first stage at once; its dial gives up after 5 s.
        expect(tid("answer-text")).to_contain_text(
            f"because the first stage {first_node} does not accept links", timeout=30_000
        )
        expect(answer).to_have_attribute("data-can-answer", "false")
        expect(answer).to_contain_text("The swarm cannot answer since")
        expect(tid("stat-coverage")).to_have_text(f"{N_LAYER} / {N_LAYER}")

        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "operator-page-3-stages.png"), full_page=True)
        page.screenshot(path=str(ARTIFACTS / "operator-page-cannot-answer.png"))


def test_the_page_says_which_layers_have_no_spare(
    tmp_path_factory: pytest.TempPathFactory, browser_page: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Three stages and one spare: the spare stands by for the stage whose volunteer said
    they leave soon (its heartbeat answer names those layers), and the page lists the
    other two stages' layers as having no spare."""
    import time

    from app.identity import join_swarm

    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    root = tmp_path_factory.mktemp("spares")
    model = write_tiny_model(root / "tiny-llama.gguf", n_layer=N_LAYER)
    args = ["--spares", "1"]
    with CoordinatorProcess.start(
        root / "data", model, password=PASSWORD, min_stages=3, extra_args=args
    ) as coord:
        code = coord.admin.create_invite("worker", uses=4)["code"]
        nodes = [join_swarm(code, root / f"node{i}") for i in range(4)]
        for identity in nodes:
            _node_heartbeat(identity)
        swarm = coord.admin.swarm()
        assert len(swarm["plan"]) == 3 and len(swarm["spares"]) == 1
        (spare_id,) = swarm["spares"]
        leaving = swarm["plan"][1]  # its volunteer says they stop in ten minutes
        node = next(n for n in nodes if n.node_id == leaving["node_id"])
        _node_heartbeat(node, available_until=time.time() + 600)
        spare = next(n for n in nodes if n.node_id == spare_id)
        answer = _node_heartbeat(spare)
        assert answer["assignment"] is None  # still a spare, not in the chain
        assert answer["standby"]["layers"] == leaving["layers"]
        bare = sorted(tuple(s["layers"]) for s in swarm["plan"] if s is not leaving)

        page = browser_page
        tid = page.get_by_test_id
        page.goto(coord.url)
        tid("login-password").fill(PASSWORD)
        tid("login-submit").click()
        expect(tid("coverage-segment")).to_have_count(3)
        expect(tid("no-spare-box")).to_be_visible()
        expect(tid("no-spare")).to_have_text(", ".join(f"{a}–{b - 1}" for a, b in bare))
        lo, hi = leaving["layers"]
        expect(tid("spares")).to_have_text(f"{spare_id} (ready for {lo}–{hi - 1})")  # inclusive
        ARTIFACTS.mkdir(exist_ok=True)
        page.screenshot(path=str(ARTIFACTS / "operator-page-no-spare.png"), full_page=True)


class _Beats:
    """Test nodes heartbeating every 0.4 s on a thread, as workers do; `kill` stops one."""

    def __init__(self) -> None:
        import threading

        self._nodes: dict[str, tuple[Any, dict[str, Any]]] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self.failures: list[str] = []
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def set(self, identity: Any, **fields: Any) -> None:
        """From now on `identity` beats with `fields` (and says so at once)."""
        with self._lock:
            self._nodes[identity.node_id] = (identity, fields)
        _node_heartbeat(identity, **fields)

    def kill(self, identity: Any) -> None:
        with self._lock:
            self._nodes.pop(identity.node_id, None)

    def _run(self) -> None:
        while not self._stop.wait(0.4):
            with self._lock:
                nodes = list(self._nodes.values())
            for identity, fields in nodes:
                try:
                    _node_heartbeat(identity, **fields)
                except Exception as exc:  # shown when the test fails
                    self.failures.append(f"{identity.node_id}: {exc}")

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)


def test_the_timeline_tells_a_pause_a_death_and_a_promotion(
    tmp_path_factory: pytest.TempPathFactory, browser_page: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two stages and a spare, named by their invites' notes: a download's progress on the
    page, a stage killed (stale, then gone, the spare promoted in its place) and a stage
    paused by its volunteer: paused with the reason, distinct from gone, all in the
    timeline; the gone node forgotten and a node renamed from the page. The timeline's
    screenshot goes to artifacts/operator-timeline.png."""
    import time

    from app.identity import join_swarm

    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    root = tmp_path_factory.mktemp("timeline")
    model = write_tiny_model(root / "tiny-llama.gguf", n_layer=N_LAYER)
    args = ["--spares", "1", "--stale-after", "3", "--dead-after", "6"]
    with CoordinatorProcess.start(
        root / "data", model, password=PASSWORD, min_stages=2, extra_args=args
    ) as coord:
        # The operator reads at start where the page is and how to trust its certificate.
        deadline = time.monotonic() + 10
        while "fingerprint SHA256:" not in coord.output() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert f"operator page: open {coord.url.rstrip('/')}/" in coord.output()
        assert str(coord.ca_path) in coord.output()

        notes = ["Asha's PC", "rack 3", "Ravi's laptop"]
        nodes = []
        for i, note in enumerate(notes):
            code = coord.admin.post(
                "/api/v1/invites", json={"role": "worker", "uses": 1, "expires": "1h", "note": note}
            )["code"]
            nodes.append(join_swarm(code, root / f"node{i}"))
        beats = _Beats()
        try:
            for identity in nodes:
                beats.set(identity, activity="waiting")
            swarm = coord.admin.swarm()
            assert len(swarm["plan"]) == 2 and len(swarm["spares"]) == 1
            by_id = {n.node_id: n for n in nodes}
            first, second = (by_id[s["node_id"]] for s in swarm["plan"])
            spare = by_id[swarm["spares"][0]]
            name = {n.node_id: note for n, note in zip(nodes, notes, strict=True)}

            page = browser_page
            tid = page.get_by_test_id
            page.goto(coord.url)
            tid("login-password").fill(PASSWORD)
            tid("login-submit").click()

            def row(identity: Any) -> Any:
                return page.locator(f'[data-testid="node-row"][data-node-id="{identity.node_id}"]')

            def events(kind: str, identity: Any | None = None) -> Any:
                where = f'[data-node-id="{identity.node_id}"]' if identity else ""
                return page.locator(f'[data-testid="event"][data-kind="{kind}"]{where}')

            # -- names from the invites' notes; a download's progress, then serving
            expect(row(first).get_by_test_id("node-name")).to_have_text(name[first.node_id])
            mib = 1 << 20
            progress = {"download_done_bytes": 40 * mib, "download_total_bytes": 100 * mib}
            beats.set(first, activity="downloading", **progress)
            expect(row(first).get_by_test_id("node-activity")).to_have_text(
                "downloading 40% (40 of 100 MiB)"
            )
            expect(row(first).get_by_test_id("node-progress")).to_be_visible()
            expect(events("downloading", first)).to_have_count(1)
            for stage in (first, second):
                beats.set(stage, activity="serving", backend="CPU (haswell)", n_layers=4)
            beats.set(spare, activity="standby")
            expect(row(first).get_by_test_id("node-activity")).to_have_text("serving")
            expect(row(first).get_by_test_id("node-progress")).to_be_hidden()
            expect(events("serving", first)).to_have_count(1)

            # -- kill the second stage: silent, then gone; the spare takes its layers
            beats.kill(second)
            expect(events("stale", second)).to_have_count(1, timeout=TIMEOUT_MS)
            expect(events("gone", second)).to_have_count(1, timeout=TIMEOUT_MS)
            expect(events("promoted", spare)).to_have_count(1, timeout=TIMEOUT_MS)
            expect(row(second).get_by_test_id("node-health")).to_have_text("gone")
            told = [(e["kind"], e["node_id"]) for e in coord.admin.get("/api/v1/events")]
            # Told in the order it happened: gone, then the plan without it.
            assert told.index(("gone", second.node_id)) < told.index(("promoted", spare.node_id))
            assert ("standby", spare.node_id) in told
            beats.set(spare, activity="serving", backend="CPU (haswell)", n_layers=4)
            # Its beats come from their own thread: wait until the page has them, so
            # the events below follow it in the timeline.
            expect(events("serving", spare)).to_have_count(1, timeout=TIMEOUT_MS)

            # -- the first stage's volunteer pauses: paused with the reason, not gone
            beats.set(first, paused="on battery")
            first_row = row(first)
            expect(first_row.get_by_test_id("node-health")).to_have_text("paused")
            expect(first_row.get_by_test_id("node-paused-reason")).to_have_text("on battery")
            expect(events("paused", first).get_by_test_id("event-detail")).to_have_text(
                "on battery"
            )
            expect(events("no_plan")).to_have_count(1)
            # Slow paused beats are no death: still paused after the stale time.
            beats.kill(first)
            _node_heartbeat(first, paused="on battery")
            time.sleep(4)
            expect(first_row.get_by_test_id("node-health")).to_have_text("paused")
            expect(row(second).get_by_test_id("node-health")).to_have_text("gone")
            expect(events("stale", first)).to_have_count(0)
            _node_heartbeat(first, paused="on battery")
            expect(first_row.get_by_test_id("node-forget")).to_be_hidden()
            expect(row(second).get_by_test_id("node-forget")).to_be_visible()
            # The newest event comes first; node names beside their ids.
            expect(tid("event").first).to_have_attribute("data-kind", "no_plan")
            expect(events("gone", second).get_by_test_id("event-node")).to_contain_text(
                f"{name[second.node_id]} {second.node_id}"
            )

            ARTIFACTS.mkdir(exist_ok=True)
            page.evaluate("window.scrollTo(0, 0)")
            swarm_box = tid("swarm-table").bounding_box()
            panel = page.locator("section", has=tid("timeline"))
            panel.scroll_into_view_if_needed()
            page.evaluate("window.scrollTo(0, 0)")
            top = swarm_box["y"] - 60
            bottom_box = panel.bounding_box()
            page.screenshot(
                path=str(ARTIFACTS / "operator-timeline.png"),
                full_page=True,
                clip={
                    "x": 0,
                    "y": top,
                    "width": 1360,
                    "height": bottom_box["y"] + bottom_box["height"] - top + 12,
                },
            )

            # -- forget the gone node from the page; rename the promoted spare
            page.once("dialog", lambda dialog: dialog.accept())
            row(second).get_by_test_id("node-forget").click()
            expect(row(second)).to_have_count(0)
            expect(events("forgotten", second)).to_have_count(1)
            page.once("dialog", lambda dialog: dialog.accept("Ravi's desktop"))
            row(spare).get_by_test_id("node-rename").click()
            expect(row(spare).get_by_test_id("node-name")).to_have_text("Ravi's desktop")
            expect(events("renamed", spare)).to_have_count(1)
            assert not beats.failures, beats.failures
        finally:
            beats.close()
