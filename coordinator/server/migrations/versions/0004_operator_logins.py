"""Operator logins are kept in the database: a restarted coordinator still knows them.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "operator_logins",
        sa.Column("token_hash", sa.String(64), primary_key=True),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
    )
    op.create_index("ix_operator_logins_expires_at", "operator_logins", ["expires_at"])


def downgrade() -> None:
    op.drop_index("ix_operator_logins_expires_at", "operator_logins")
    op.drop_table("operator_logins")
