"""Chunks of HTML keep where their lines of the file change, so a quote can name its own lines.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # Pairs of (offset into the chunk's text, line of the file from there on), flattened; NULL
    # where the text's lines are the file's (plain text, Markdown), where there are no lines
    # (PDF, DOCX), and for chunks stored before this column (their quotes name the chunk's lines).
    op.add_column("chunks", sa.Column("line_marks", postgresql.ARRAY(sa.Integer()), nullable=True))


def downgrade() -> None:
    op.drop_column("chunks", "line_marks")
