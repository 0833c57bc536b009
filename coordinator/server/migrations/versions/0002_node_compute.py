"""Nodes say what runs their stage: backend, device memory used and cap, layers on the GPU.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

# Server defaults fill the rows of nodes that joined before this migration (NOT NULL
# columns cannot be added to a populated table without one); the model declares the same.
COLUMNS = (
    ("backend", sa.String(200), ""),
    ("device_bytes_used", sa.BigInteger(), "0"),
    ("device_cap_bytes", sa.BigInteger(), "0"),
    ("gpu_layers", sa.Integer(), "0"),
    ("n_layers", sa.Integer(), "0"),
)


def upgrade() -> None:
    for name, kind, default in COLUMNS:
        op.add_column("nodes", sa.Column(name, kind, nullable=False, server_default=default))


def downgrade() -> None:
    # SQLite drops columns only by rebuilding the table; batch mode does that for it.
    with op.batch_alter_table("nodes") as batch:
        for name, _kind, _default in reversed(COLUMNS):
            batch.drop_column(name)
