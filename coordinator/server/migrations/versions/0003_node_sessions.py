"""Nodes say how many sessions their stage runs and admits, and its KV budget and use.

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None

# Server defaults fill the rows of nodes that joined before this migration, as in 0002.
COLUMNS = (
    ("sessions", sa.Integer(), "0"),
    ("max_sessions", sa.Integer(), "0"),
    ("kv_budget_bytes", sa.BigInteger(), "0"),
    ("kv_reserved_bytes", sa.BigInteger(), "0"),
)


def upgrade() -> None:
    for name, kind, default in COLUMNS:
        op.add_column("nodes", sa.Column(name, kind, nullable=False, server_default=default))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        for name, _kind, _default in reversed(COLUMNS):
            batch.drop_column(name)
