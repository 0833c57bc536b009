"""What the coordinator prints at start: the page's address and how to trust its
certificate (coordinator/server/serve.py)."""

from __future__ import annotations

from pathlib import Path

import pytest

from coordinator.server.serve import fingerprint_text, page_guidance

pytestmark = pytest.mark.unit

FINGERPRINT = "0a" + "ff" * 31


def test_the_guidance_names_the_page_the_ca_file_and_its_fingerprint() -> None:
    text = page_guidance("https://192.0.2.7:8443", Path("/srv/sangama/ca/ca.pem"), FINGERPRINT)
    assert "open https://192.0.2.7:8443/" in text
    assert "/srv/sangama/ca/ca.pem" in text
    assert "SHA256:0A:FF:FF" in text and "warn" in text


def test_every_interface_is_worded_as_this_pcs_address() -> None:
    text = page_guidance("https://0.0.0.0:9000", Path("ca.pem"), FINGERPRINT)
    assert "https://127.0.0.1:9000/ on this PC" in text and "0.0.0.0" not in text


def test_the_fingerprint_reads_as_browsers_show_it() -> None:
    assert fingerprint_text("abcd01") == "SHA256:AB:CD:01"
