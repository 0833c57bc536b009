"""The operator's event timeline, nodes' names (from the invite's note, editable), and
nodes the operator forgot (hidden, kept until their certificates expire).

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "events",
        sa.Column("id", sa.Integer(), primary_key=True),
        sa.Column("at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("kind", sa.String(32), nullable=False),
        sa.Column("node_id", sa.String(64), nullable=False, server_default=""),
        sa.Column("detail", sa.String(300), nullable=False, server_default=""),
    )
    # Server defaults fill the rows of nodes that joined before this migration, as in 0002.
    op.add_column("nodes", sa.Column("name", sa.String(64), nullable=False, server_default=""))
    op.add_column("nodes", sa.Column("forgotten_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("nodes") as batch:
        batch.drop_column("forgotten_at")
        batch.drop_column("name")
    op.drop_table("events")
