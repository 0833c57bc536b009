"""Initial schema: invites, nodes, certificates, rtts, samples, settings.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TZ = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "invites",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("secret_hash", sa.String(64), nullable=False),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("max_uses", sa.Integer, nullable=False),
        sa.Column("uses_left", sa.Integer, nullable=False),
        sa.Column("expires_at", TZ, nullable=False),
        sa.Column("revoked", sa.Boolean, nullable=False),
        sa.Column("created_at", TZ, nullable=False),
        sa.Column("note", sa.String(200), nullable=False),
    )
    op.create_index("ix_invites_secret_hash", "invites", ["secret_hash"], unique=True)
    op.create_table(
        "nodes",
        sa.Column("node_id", sa.String(64), primary_key=True),
        sa.Column("role", sa.String(16), nullable=False),
        sa.Column("token_hash", sa.String(64), nullable=False),
        sa.Column("invite_id", sa.Integer, sa.ForeignKey("invites.id"), nullable=True),
        sa.Column("address", sa.String(200), nullable=False),
        sa.Column("capacity_bytes", sa.BigInteger, nullable=False),
        sa.Column("vram_cap_bytes", sa.BigInteger, nullable=False),
        sa.Column("hardware", sa.JSON, nullable=False),
        sa.Column("stats", sa.JSON, nullable=False),
        sa.Column("path", sa.String(32), nullable=False),
        sa.Column("last_seen", TZ, nullable=True),
        sa.Column("revoked", sa.Boolean, nullable=False),
        sa.Column("created_at", TZ, nullable=False),
    )
    op.create_table(
        "certificates",
        sa.Column("serial", sa.String(64), primary_key=True),
        sa.Column("node_id", sa.String(64), sa.ForeignKey("nodes.node_id"), nullable=False),
        sa.Column("not_after", TZ, nullable=False),
        sa.Column("revoked", sa.Boolean, nullable=False),
    )
    op.create_index("ix_certificates_node_id", "certificates", ["node_id"])
    op.create_table(
        "rtts",
        sa.Column("src", sa.String(64), primary_key=True),
        sa.Column("dst", sa.String(64), primary_key=True),
        sa.Column("ms", sa.Float, nullable=False),
        sa.Column("measured_at", TZ, nullable=False),
    )
    op.create_table(
        "samples",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("at", TZ, nullable=False),
        sa.Column("node_id", sa.String(64), nullable=False),
        sa.Column("tokens", sa.Integer, nullable=False),
        sa.Column("compute_ms", sa.Float, nullable=False),
    )
    op.create_index("ix_samples_at", "samples", ["at"])
    op.create_table(
        "settings",
        sa.Column("key", sa.String(64), primary_key=True),
        sa.Column("value", sa.String(4000), nullable=False),
    )


def downgrade() -> None:
    for table in ("settings", "samples", "rtts", "certificates", "nodes", "invites"):
        op.drop_table(table)
