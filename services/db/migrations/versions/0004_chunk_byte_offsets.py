"""UTF-8 byte offsets of every chunk, next to its code-point offsets.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Nullable: chunks indexed earlier have no byte offsets until their document is re-ingested.
    op.add_column("chunks", sa.Column("start_byte", sa.BigInteger(), nullable=True))
    op.add_column("chunks", sa.Column("end_byte", sa.BigInteger(), nullable=True))


def downgrade() -> None:
    op.drop_column("chunks", "end_byte")
    op.drop_column("chunks", "start_byte")
