"""What anyone who reaches a worker's UDP port can make it hold, seen from outside: links
that complete TLS (which proves only the worker) but never prove themselves.

A real `sangama worker` process on loopback; the attacker holds a certificate of its own
CA (TLS lets it in: the worker checks clients at the application layer) and dials raw
QUIC links. Asserted are the worker's resident memory (a count of bytes) and which
links it closed, never how fast.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import pytest

from app.lab.local_swarm import LocalSwarm
from net import auth, wire
from net.quic.links import LinkError, QuicLink, QuicTuning, TlsIdentity, connect
from tests.support.tiny_models import write_tiny_model

pytestmark = pytest.mark.integration

HOSTILE_LINKS = 100
ANNOUNCED = wire.DEFAULT_LIMITS.max_frame_bytes - wire.HEADER.size
"""The body length each hostile HELLO announces: the most the general frame cap allows."""
TRICKLED = 256 << 10
"""Bytes of that body each link then sends (the worker used to buffer them all)."""
RSS_SLACK = 8 << 20
"""How much the worker's RSS may grow under the whole attack (it grew ~25 MiB before)."""
PATIENCE_S = 15.0
"""How long to wait before calling a test failed; never an expectation of speed."""
TUNING = QuicTuning(idle_timeout=PATIENCE_S, keepalive=1.0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_model(tmp_path_factory.mktemp("unauth") / "tiny4.gguf", n_layer=4)


def attacker_identity(swarm: LocalSwarm) -> TlsIdentity:
    """A certificate of the attacker's own CA; it trusts the swarm's public CA, so TLS
    to the worker succeeds."""
    assert swarm.workdir is not None
    rogue = auth.create_ca("rogue")
    key = auth.new_private_key()
    cert = auth.issue_node_certificate(rogue, "intruder", key.public_key(), "client")
    return TlsIdentity(
        certificate_pem=auth.certificate_pem(cert),
        private_key_pem=auth.private_key_pem(key),
        ca_pem=(swarm.workdir / "ca" / "ca.pem").read_bytes(),
    )


def rss_bytes(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS")


async def dial(swarm: LocalSwarm, identity: TlsIdentity, timeout: float) -> QuicLink | None:
    """A TLS-only link to the first stage, or None where the worker did not take it."""
    assert swarm.route is not None
    try:
        return await connect(swarm.route.first.address, identity, "stage0", TUNING, timeout)
    except LinkError:
        return None


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc for RSS")
def test_links_announcing_huge_frames_before_authentication_cost_the_worker_little(
    tiny: Path,
) -> None:
    async def scenario() -> tuple[int, int, int]:
        async with LocalSwarm(model=str(tiny), cuts=[0, 4]) as swarm:
            pid = swarm.workers[0].process.pid
            identity = attacker_identity(swarm)
            before = rss_bytes(pid)
            head = wire.HEADER.pack(ANNOUNCED, wire.VERSION, wire.FrameType.HELLO)
            body = bytes(TRICKLED)
            links: list[QuicLink] = []

            async def hostile() -> None:
                link = await dial(swarm, identity, timeout=3.0)
                if link is None:
                    return
                links.append(link)
                # The worker may close the link at any moment: the sends then fail.
                with contextlib.suppress(Exception):
                    link.send(head)
                    for i in range(0, TRICKLED, 16 << 10):
                        await asyncio.sleep(0.01)
                        if link.closed.done():
                            return
                        link.send(body[i : i + (16 << 10)])

            await asyncio.gather(*(hostile() for _ in range(HOSTILE_LINKS)))
            await asyncio.sleep(1.0)  # the worker has read what reached it
            after = rss_bytes(pid)
            refused = sum(1 for link in links if link.closed.done())
            for link in links:
                link.close()
            return before, after, refused

    before, after, refused = asyncio.run(scenario())
    print(f"worker RSS {before >> 20} -> {after >> 20} MiB; {refused} links closed by it")
    assert after - before <= RSS_SLACK, f"worker RSS grew {(after - before) >> 20} MiB"


def test_links_that_never_authenticate_are_closed_after_the_deadline(tiny: Path) -> None:
    async def scenario() -> list[str]:
        async with LocalSwarm(model=str(tiny), cuts=[0, 4], auth_timeout=1.0) as swarm:
            identity = attacker_identity(swarm)
            links = [await dial(swarm, identity, timeout=PATIENCE_S) for _ in range(4)]
            assert all(link is not None for link in links)
            # Never a HELLO: each link only keeps itself alive with PINGs.
            return [await asyncio.wait_for(link.closed, PATIENCE_S) for link in links if link]

    reasons = asyncio.run(scenario())
    assert len(reasons) == 4
    assert all("not authenticated" in r for r in reasons), reasons
