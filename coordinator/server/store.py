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

    def revoked_serials(self) -> list[str]:
        with self.session() as s:
            return list(s.scalars(select(Certificate.serial).where(Certificate.revoked)))

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
