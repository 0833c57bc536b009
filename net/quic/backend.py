"""The pieces of a QUIC link that are not its driver: this node's TLS identity, the link
tuning, and `QuicBackend`, the sans-IO parts of one QUIC library (qh3 by default, aioquic
selectable), where the two libraries' differences are handled and nowhere else.
net.quic.links drives a connection these build.
"""

from __future__ import annotations

import hashlib
import importlib
import ssl
from dataclasses import dataclass, field
from typing import Any

import aioquic.buffer
import aioquic.quic.events
import aioquic.quic.packet
from aioquic.quic.configuration import QuicConfiguration
from aioquic.quic.connection import QuicConnection
from cryptography import x509
from cryptography.hazmat.primitives import serialization

from net.peer_limits import STEP_WINDOW_BYTES
from net.quic.ack_policy import ACK_HOLD
from net.quic.logs import quiet_expected_closes
from net.quic.path_mtu import PROBE_CEILING, probe_ceiling
from net.rate import AsyncThrottle

quiet_expected_closes()  # qh3 says WARNING for every ordinary close by the peer

ALPN = ["sangama/1"]


@dataclass(frozen=True)
class TlsIdentity:
    """This node's certificate chain and key, and the swarm CA it trusts, as PEM."""

    certificate_pem: bytes
    private_key_pem: bytes
    ca_pem: bytes

    @property
    def certificate_sha256(self) -> bytes:
        cert = x509.load_pem_x509_certificate(self.certificate_pem)
        return hashlib.sha256(cert.public_bytes(serialization.Encoding.DER)).digest()


QUIC_LIBRARIES = ("aioquic", "qh3")
DEFAULT_LIBRARY = "qh3"
"""Measured faster per hop with the same TLS and client proof (bench/README.md)."""


@dataclass(frozen=True)
class QuicTuning:
    max_datagram_size: int = 1200
    """The size every datagram has without path MTU discovery (aioquic, ICE and TURN
    paths, server ends, platforms without Don't Fragment) and where discovery starts."""
    probe_max_datagram_size: int = PROBE_CEILING
    """qh3 client ends on plain UDP paths probe up to this (net.quic.path_mtu); <= 1200: off."""
    idle_timeout: float = 5.0
    """A path silent this long is dead: the link closes and is re-established (worker
    links resume their sessions), so this bounds how long a generation stalls."""
    keepalive: float = 1.25
    """Seconds between PINGs on an idle link: keeps NAT mappings and detects dead peers."""
    pace: bool = False
    ack_hold: float = ACK_HOLD
    """Seconds the ACK of a one-packet frame may wait for the next frame when frames
    come closer together than this (net.quic.ack_policy); 0: every ACK leaves at once."""
    library: str = DEFAULT_LIBRARY
    """"qh3" (default: Rust packet core, less CPU per hop) or "aioquic" (same sans-IO API)."""
    stream_window_bytes: int = STEP_WINDOW_BYTES
    """QUIC receive window of a link's stream and connection (net.peer_limits)."""
    send_throttle: AsyncThrottle | None = field(default=None, compare=False, repr=False)
    """The volunteer's upload cap, shared by every link that carries this tuning."""

    def __post_init__(self) -> None:
        if self.library not in QUIC_LIBRARIES:
            raise ValueError(f"QUIC library must be one of {QUIC_LIBRARIES}, not {self.library!r}")


class QuicBackend:
    """The sans-IO pieces of one QUIC library. qh3 is an aioquic fork with a Rust core;
    the differences that matter here are handled in this class and nowhere else."""

    def __init__(self, name: str) -> None:
        self.name = name
        if name == "aioquic":
            self._connection: Any = QuicConnection
            self._configuration: Any = QuicConfiguration
            self.events: Any = aioquic.quic.events
            self._buffer: Any = aioquic.buffer.Buffer  # type: ignore[attr-defined]
            packet: Any = aioquic.quic.packet
        else:
            self._connection = importlib.import_module("qh3.quic.connection").QuicConnection
            self._configuration = importlib.import_module(
                "qh3.quic.configuration"
            ).QuicConfiguration
            self.events = importlib.import_module("qh3.quic.events")
            self._buffer = importlib.import_module("qh3._hazmat").Buffer
            packet = importlib.import_module("qh3.quic.packet")
        self._pull_header = packet.pull_quic_header
        self._initial = packet.QuicPacketType.INITIAL

    def configuration(
        self,
        identity: TlsIdentity,
        is_client: bool,
        tuning: QuicTuning,
        server_name: str | None,
        probe: bool = False,
    ) -> Any:
        """`probe`: the path sends datagrams whole or not at all (net.quic.path_mtu), so a
        qh3 client may discover its MTU; qh3 then treats `max_datagram_size` as the
        ceiling and starts every path at 1200."""
        ceiling = probe_ceiling(tuning.probe_max_datagram_size) if probe and is_client else 0
        probing = self.name == "qh3" and ceiling > tuning.max_datagram_size
        cfg = self._configuration(
            is_client=is_client,
            alpn_protocols=ALPN,
            idle_timeout=tuning.idle_timeout,
            max_datagram_size=ceiling if probing else tuning.max_datagram_size,
            # One stream a link: the connection's window is the stream's. Sized for a
            # step's hidden state, not more: the library keeps data past a gap up to the
            # window, for any peer that finished TLS (net.peer_limits).
            max_data=tuning.stream_window_bytes,
            max_stream_data=tuning.stream_window_bytes,
        )
        if self.name == "aioquic":
            certs = x509.load_pem_x509_certificates(identity.certificate_pem)
            cfg.certificate = certs[0]
            cfg.certificate_chain = certs[1:]
            cfg.private_key = serialization.load_pem_private_key(
                identity.private_key_pem, password=None
            )
        else:
            cfg.load_cert_chain(identity.certificate_pem, identity.private_key_pem)
            cfg.probe_datagram_size = probing
            if is_client:  # qh3 does not offer Ed25519 unless asked; swarm keys are Ed25519
                sa = importlib.import_module("qh3.tls").SignatureAlgorithm
                cfg.signature_algorithms = [
                    sa.ED25519,
                    sa.ECDSA_SECP256R1_SHA256,
                    sa.RSA_PSS_RSAE_SHA256,
                ]
        cfg.load_verify_locations(cadata=identity.ca_pem)  # only the swarm CA, no system roots
        cfg.verify_mode = ssl.CERT_REQUIRED
        if is_client:
            cfg.server_name = server_name
        return cfg

    def new_connection(self, config: Any, tuning: QuicTuning, odcid: bytes | None = None) -> Any:
        quic = self._connection(configuration=config, original_destination_connection_id=odcid)
        if self.name == "aioquic" and not tuning.pace:
            # aioquic's pacer spreads a burst over the RTT; a hidden state is a 2-10
            # packet burst that must leave at once. Congestion control still applies.
            quic._loss._pacer.next_send_time = _never_wait
        return quic

    @property
    def receives_bursts(self) -> bool:
        """The library takes a burst of datagrams in one call (qh3's
        `receive_many_datagrams`: one pass into its core, not a header parse per packet
        in Python first)."""
        return self.name == "qh3"

    def datagrams_to_send(self, quic: Any, now: float) -> list[tuple[bytes, Any]]:
        """qh3: its core's transmits polled directly (the wrapper adds two logging calls
        a datagram, which do nothing without a QUIC logger); aioquic: its own method."""
        core = getattr(quic, "_core", None) if self.name == "qh3" else None
        if core is None or quic._quic_logger is not None:
            return list(quic.datagrams_to_send(now=now))
        out = []
        while (transmit := core.poll_transmit(now)) is not None:
            out.append((transmit[0], transmit[1]))
        return out

    def ack_due(self, quic: Any) -> float | None:
        """When the connection's next timer is a pending 1-RTT ACK: its deadline (qh3)."""
        core = getattr(quic, "_core", None) if self.name == "qh3" else None
        timer = None if core is None else core.get_timer()
        return timer[1] if timer is not None and timer[0] == "ack_application" else None

    def initial_dcid(self, data: bytes) -> bytes | None:
        """The destination connection id of a client's Initial packet, else None."""
        try:
            header = self._pull_header(self._buffer(data=data), host_cid_length=8)
        except ValueError:
            return None
        return bytes(header.destination_cid) if header.packet_type == self._initial else None

    def peer_certificate_der(self, quic: Any) -> bytes | None:
        if self.name == "aioquic":
            cert = quic.tls._peer_certificate  # aioquic 1.7.2 has no public accessor
            return None if cert is None else bytes(cert.public_bytes(serialization.Encoding.DER))
        cert = quic.get_peercert()
        return None if cert is None else bytes(cert.public_bytes())


def _never_wait(now: float) -> None:
    return None


_backends: dict[str, QuicBackend] = {}


def backend(name: str) -> QuicBackend:
    if name not in _backends:
        _backends[name] = QuicBackend(name)
    return _backends[name]
