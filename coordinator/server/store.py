"""The coordinator's database: SQLAlchemy models and the queries the service needs.

SQLite by default (a file, nothing to install); any SQLAlchemy URL (PostgreSQL) works.
The schema is created and upgraded by Alembic migrations (coordinator/server/migrations).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Float,
    ForeignKey,
    Integer,
    String,
    create_engine,
    delete,
    event,
    select,
)
from sqlalchemy.engine import Engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column, sessionmaker

if TYPE_CHECKING:  # alembic is imported only when migrating
    from alembic.config import Config

    from coordinator.contract import Heartbeat

MIGRATIONS = Path(__file__).parent / "migrations"


def utcnow() -> dt.datetime:
    return dt.datetime.now(dt.UTC)


def as_utc(value: dt.datetime) -> dt.datetime:
    """SQLite returns naive datetimes; everything here is UTC."""
    return value if value.tzinfo is not None else value.replace(tzinfo=dt.UTC)


class Base(DeclarativeBase):
    pass


class Invite(Base):
    __tablename__ = "invites"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    secret_hash: Mapped[str] = mapped_column(String(64), unique=True, index=True)
    role: Mapped[str] = mapped_column(String(16))
    max_uses: Mapped[int] = mapped_column(Integer)
    uses_left: Mapped[int] = mapped_column(Integer)
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    note: Mapped[str] = mapped_column(String(200), default="")


class Node(Base):
    __tablename__ = "nodes"
    node_id: Mapped[str] = mapped_column(String(64), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))
    token_hash: Mapped[str] = mapped_column(String(64))
    invite_id: Mapped[int | None] = mapped_column(ForeignKey("invites.id"), nullable=True)
    address: Mapped[str] = mapped_column(String(200), default="")
    capacity_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    vram_cap_bytes: Mapped[int] = mapped_column(BigInteger, default=0)
    hardware: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    stats: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    path: Mapped[str] = mapped_column(String(32), default="direct")
    # What runs the node's stage, as its last heartbeat said (migration 0002).
    backend: Mapped[str] = mapped_column(String(200), default="", server_default="")
    device_bytes_used: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    device_cap_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    gpu_layers: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    # Sessions and KV reserved on its stage, as its last heartbeat said (migration 0003).
    sessions: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    max_sessions: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    kv_budget_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    kv_reserved_bytes: Mapped[int] = mapped_column(BigInteger, default=0, server_default="0")
    n_layers: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    last_seen: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)
    created_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    # The operator's name for it (its invite's note at first) and when the operator
    # forgot it: a forgotten node is out of the registry, its row kept (revoked) until
    # its certificates expire (migration 0005).
    name: Mapped[str] = mapped_column(String(64), default="", server_default="")
    forgotten_at: Mapped[dt.datetime | None] = mapped_column(DateTime(timezone=True), nullable=True)


class Certificate(Base):
    __tablename__ = "certificates"
    serial: Mapped[str] = mapped_column(String(64), primary_key=True)
    """Decimal string: X.509 serials are up to 159 bits, more than BIGINT holds."""
    node_id: Mapped[str] = mapped_column(ForeignKey("nodes.node_id"), index=True)
    not_after: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True))
    revoked: Mapped[bool] = mapped_column(Boolean, default=False)


class Rtt(Base):
    __tablename__ = "rtts"
    src: Mapped[str] = mapped_column(String(64), primary_key=True)
    dst: Mapped[str] = mapped_column(String(64), primary_key=True)
    ms: Mapped[float] = mapped_column(Float)
    measured_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)


class Sample(Base):
    """Throughput and timing samples reported by nodes, for the operator's plot."""

    __tablename__ = "samples"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow, index=True)
    node_id: Mapped[str] = mapped_column(String(64))
    tokens: Mapped[int] = mapped_column(Integer, default=0)
    compute_ms: Mapped[float] = mapped_column(Float, default=0.0)


class Event(Base):
    """One line of the operator's timeline (coordinator/server/timeline.py keeps the
    newest few hundred). `node_id` is no foreign key: a forgotten node's story stays."""

    __tablename__ = "events"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), default=utcnow)
    kind: Mapped[str] = mapped_column(String(32))
    node_id: Mapped[str] = mapped_column(String(64), default="", server_default="")
    detail: Mapped[str] = mapped_column(String(300), default="", server_default="")


class Setting(Base):
    __tablename__ = "settings"
    key: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[str] = mapped_column(String(4000))


class OperatorLogin(Base):
    """A signed-in operator's browser session: kept in the database so that a restarted
    coordinator still knows it (the cookie keeps working). Only the token's hash."""

    __tablename__ = "operator_logins"
    token_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    expires_at: Mapped[dt.datetime] = mapped_column(DateTime(timezone=True), index=True)


# ---------------------------------------------------------------- engine and schema


def make_engine(url: str) -> Engine:
    engine = create_engine(url, future=True, pool_pre_ping=True)
    if url.startswith("sqlite"):

        @event.listens_for(engine, "connect")
        def _sqlite_pragmas(conn: Any, _record: Any) -> None:
            cur = conn.cursor()
            cur.execute("PRAGMA foreign_keys=ON")
            cur.execute("PRAGMA journal_mode=WAL")  # readers don't block the writer
            cur.close()

    return engine


def alembic_config(url: str) -> Config:
    """Alembic's configuration for this database (also for tests that step through)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    cfg.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return cfg


def migrate(url: str) -> None:
    """Create or upgrade the schema to the newest migration."""
    from alembic import command

    command.upgrade(alembic_config(url), "head")


class Store:
    def __init__(self, url: str) -> None:
        self.url = url
        self.engine = make_engine(url)
        self._sessions = sessionmaker(self.engine, expire_on_commit=False)

    @contextmanager
    def session(self) -> Iterator[Session]:
        with self._sessions() as s, s.begin():
            yield s

    # -- settings
    def get_setting(self, key: str) -> str | None:
        with self.session() as s:
            row = s.get(Setting, key)
            return None if row is None else row.value

    def set_setting(self, key: str, value: str) -> None:
        with self.session() as s:
            s.merge(Setting(key=key, value=value))

    # -- queries used by several routes
    def nodes(self, s: Session) -> list[Node]:
        """The registry: every node the operator has not forgotten."""
        query = select(Node).where(Node.forgotten_at.is_(None)).order_by(Node.node_id)
        return list(s.scalars(query))

    def node(self, node_id: str) -> Node | None:
        """The node's row, forgotten or not; None for an id never joined."""
        with self.session() as s:
            return s.get(Node, node_id)

    def revoked_serials(self) -> list[str]:
        with self.session() as s:
            return list(s.scalars(select(Certificate.serial).where(Certificate.revoked)))

    # -- certificates
    def add_certificate(self, node_id: str, serial: int, not_after: dt.datetime) -> None:
        with self.session() as s:
            s.add(
                Certificate(serial=str(serial), node_id=node_id, not_after=not_after, revoked=False)
            )

    def revoke_certificates(self, s: Session, node_id: str) -> None:
        """Mark every certificate of the node revoked, in the caller's transaction."""
        for cert in s.scalars(select(Certificate).where(Certificate.node_id == node_id)):
            cert.revoked = True

    def revoke_node(self, node_id: str) -> bool:
        """Revoke the node and its certificates; False when there is no such node."""
        with self.session() as s:
            node = s.get(Node, node_id)
            if node is None:
                return False
            node.revoked = True
            self.revoke_certificates(s, node_id)
        return True

    # -- what heartbeats write
    def record_beat(
        self, node_id: str, beat: Heartbeat, address: str, now: dt.datetime
    ) -> dt.datetime | None:
        """Store what a (joined) node's heartbeat reports, its links' round trips and its
        throughput sample; return when it was heard from before."""
        with self.session() as s:
            node = s.get(Node, node_id)
            assert node is not None
            heard = node.last_seen
            node.address = address
            node.capacity_bytes = max(0, beat.capacity_bytes)
            node.vram_cap_bytes = max(0, beat.vram_cap_bytes)
            node.hardware = beat.hardware
            node.stats = beat.stats
            node.path = beat.path[:32]
            node.backend = beat.backend[:200]
            node.device_bytes_used = max(0, beat.device_bytes_used)
            node.device_cap_bytes = max(0, beat.device_cap_bytes)
            node.gpu_layers = max(0, beat.gpu_layers)
            node.n_layers = max(0, beat.n_layers)
            node.sessions = max(0, beat.sessions)
            node.max_sessions = max(0, beat.max_sessions)
            node.kv_budget_bytes = max(0, beat.kv_budget_bytes)
            node.kv_reserved_bytes = max(0, beat.kv_reserved_bytes)
            node.last_seen = now
            s.execute(delete(Rtt).where(Rtt.src == node_id))
            for peer, ms in list(beat.rtt_ms.items())[:256]:
                s.add(Rtt(src=node_id, dst=peer[:64], ms=float(ms), measured_at=now))
            if beat.tokens or beat.compute_ms:
                s.add(
                    Sample(at=now, node_id=node_id, tokens=beat.tokens, compute_ms=beat.compute_ms)
                )
        return heard

    def mark_seen(self, node_id: str, now: dt.datetime) -> dt.datetime | None:
        """A (joined) node was heard from, and nothing else; when it was heard before."""
        with self.session() as s:
            node = s.get(Node, node_id)
            assert node is not None
            heard = node.last_seen
            node.last_seen = now
        return heard

    def rename_node(self, node_id: str, name: str) -> str | None:
        """Set the node's name; its name before, or None for no such (unforgotten) node."""
        with self.session() as s:
            node = s.get(Node, node_id)
            if node is None or node.forgotten_at is not None:
                return None
            old, node.name = node.name, name
        return old

    def throughput(self, since: dt.datetime) -> list[tuple[str, int]]:
        """Tokens reported per 10-second bucket since `since`, oldest first."""
        buckets: dict[str, int] = {}
        with self.session() as s:
            for row in s.scalars(select(Sample).where(Sample.at >= since).order_by(Sample.at)):
                at = as_utc(row.at)
                key = at.replace(second=at.second - at.second % 10, microsecond=0).isoformat()
                buckets[key] = buckets.get(key, 0) + row.tokens
        return sorted(buckets.items())

    def prune(self, samples_before: dt.datetime) -> None:
        """Delete throughput samples older than `samples_before`, and forgotten nodes
        once no certificate of theirs is still valid."""
        with self.session() as s:
            s.execute(delete(Sample).where(Sample.at < samples_before))
            # Forgotten nodes are kept (revoked) while a certificate of theirs could
            # still open links; then they go for good.
            live_certs = select(Certificate.node_id).where(Certificate.not_after > utcnow())
            done = select(Node.node_id).where(
                Node.forgotten_at.is_not(None), Node.node_id.not_in(live_certs)
            )
            ids = list(s.scalars(done))
            if ids:
                s.execute(delete(Certificate).where(Certificate.node_id.in_(ids)))
                s.execute(delete(Rtt).where(Rtt.src.in_(ids)))
                s.execute(delete(Node).where(Node.node_id.in_(ids)))

    def rtt_map(self) -> dict[tuple[str, str], float]:
        with self.session() as s:
            return {(r.src, r.dst): r.ms for r in s.scalars(select(Rtt))}

    # -- the operator's timeline (coordinator/server/timeline.py)
    def add_events(self, rows: list[Event], keep: int) -> None:
        """Add events; keep only the newest `keep` (ids grow by one an event, so one
        indexed delete; a gap in the ids only keeps fewer)."""
        with self.session() as s:
            s.add_all(rows)
            s.flush()
            newest = max(r.id for r in rows)
            s.execute(delete(Event).where(Event.id <= newest - keep))

    def events(self, after: int, limit: int) -> list[Event]:
        """The newest `limit` events with an id above `after`, oldest first."""
        with self.session() as s:
            query = select(Event).where(Event.id > after).order_by(Event.id.desc()).limit(limit)
            return list(reversed(s.scalars(query).all()))

    # -- operator logins (by token hash)
    def add_login(self, token_hash: str, expires_at: dt.datetime) -> None:
        with self.session() as s:
            s.execute(delete(OperatorLogin).where(OperatorLogin.expires_at < utcnow()))
            s.merge(OperatorLogin(token_hash=token_hash, expires_at=expires_at))

    def login_valid(self, token_hash: str) -> bool:
        with self.session() as s:
            row = s.get(OperatorLogin, token_hash)
            return row is not None and as_utc(row.expires_at) > utcnow()

    def drop_login(self, token_hash: str) -> None:
        with self.session() as s:
            s.execute(delete(OperatorLogin).where(OperatorLogin.token_hash == token_hash))

    def close(self) -> None:
        self.engine.dispose()
