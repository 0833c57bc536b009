"""The operator page of a coordinator hosting two models (`--model A --model B`): the
Models panel lists each with its chain, and the swarm table says which model a stage
serves. In a real browser against a real `sangama coordinator` process."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from coordinator.contract import Heartbeat
from tests.support.coordinator_proc import CoordinatorProcess
from tests.support.probe_answerer import HARDWARE, ProbeAnswerer
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.e2e

sync_api = pytest.importorskip("playwright.sync_api", reason="needs the playwright package")
expect = sync_api.expect

CHROMIUM = Path("/usr/bin/chromium")
PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def coordinator(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CoordinatorProcess]:
    root = tmp_path_factory.mktemp("operator-page-models")
    big = write_tiny_model(root / "tiny8.gguf", n_layer=8)
    small = write_tiny_model(root / "tiny4.gguf", n_layer=4, seed=3)
    extra = ["--model", str(small)]
    with CoordinatorProcess.start(
        root / "data", big, password=PASSWORD, min_stages=1, extra_args=extra
    ) as coord:
        yield coord


def test_the_page_lists_each_model_with_its_chain(
    coordinator: CoordinatorProcess, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from app.identity import join_swarm

    chromium = shutil.which("chromium") or (str(CHROMIUM) if CHROMIUM.exists() else None)
    if chromium is None:
        pytest.skip("needs Debian's chromium (apt-get install chromium)")
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)

    # Two workers, one stage each (min_stages 1): the first model's, then the second's.
    answerers = [ProbeAnswerer(), ProbeAnswerer()]
    assignments: dict[str, Any] = {}
    try:
        for i, answerer in enumerate(answerers):
            code = coordinator.admin.create_invite("worker")["code"]
            me = join_swarm(code, tmp_path / f"w{i}")
            beat = Heartbeat(address=answerer.address, capacity_bytes=8 << 30, hardware=HARDWARE)
            me.client().heartbeat(beat)
            assignments[me.node_id] = me.client().heartbeat(beat).assignment
        models = {a.model: node for node, a in assignments.items() if a is not None}
        assert set(models) == {"tiny8", "tiny4"}, assignments

        with sync_api.sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            try:
                context = browser.new_context(ignore_https_errors=True)
                context.set_default_timeout(20_000)
                page = context.new_page()
                errors: list[str] = []
                page.on("pageerror", lambda exc: errors.append(str(exc)))
                page.goto(coordinator.url)
                page.get_by_test_id("login-password").fill(PASSWORD)
                page.get_by_test_id("login-submit").click()
                panel = page.get_by_test_id("models-panel")
                expect(panel).to_be_visible()
                rows = page.get_by_test_id("model-row")
                expect(rows).to_have_count(2)
                first = page.locator('[data-testid="model-row"][data-model="tiny8"]')
                expect(first.get_by_test_id("model-name-cell")).to_have_text("tiny8 (default)")
                expect(first.get_by_test_id("model-chain")).to_contain_text("0-7")
                second = page.locator('[data-testid="model-row"][data-model="tiny4"]')
                expect(second.get_by_test_id("model-chain")).to_contain_text("0-3")
                node = page.locator(f'[data-testid="node-row"][data-node-id="{models["tiny4"]}"]')
                expect(node.get_by_test_id("node-layers")).to_have_text("tiny4 0-3 (4)")
                assert not errors, f"JavaScript errors on the page: {errors}"
            finally:
                browser.close()
    finally:
        for answerer in answerers:
            answerer.close()
