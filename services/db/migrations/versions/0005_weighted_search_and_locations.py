"""Chunks carry their document title and headings for full-text weighting, and DOCX paragraphs.

The full-text vector weighs the chunk's context (document title and heading path) as 'A' and
its text as 'D', so ts_rank_cd can prefer a passage whose section is about the question. The
stored text that citations quote, and its offsets, do not change. Documents get an index on
(assistant_id, sha256), which retrieval uses to search one copy of identical uploads.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

CONTEXT_TSV = "setweight(to_tsvector('english', context), 'A')"
TEXT_TSV = "setweight(to_tsvector('english', text), 'D')"
WEIGHTED_TSV = f"{CONTEXT_TSV} || {TEXT_TSV}"


def upgrade() -> None:
    op.add_column("chunks", sa.Column("context", sa.Text(), nullable=False, server_default=""))
    op.alter_column("chunks", "context", server_default=None)
    # Chunks indexed before this revision get their heading path as context.
    op.execute("UPDATE chunks SET context = array_to_string(heading_path, ' ')")
    op.add_column("chunks", sa.Column("paragraph_start", sa.Integer(), nullable=True))
    op.add_column("chunks", sa.Column("paragraph_end", sa.Integer(), nullable=True))
    op.drop_index("ix_chunks_tsv", table_name="chunks")
    op.drop_column("chunks", "tsv")
    op.add_column(
        "chunks",
        sa.Column(
            "tsv",
            postgresql.TSVECTOR(),
            sa.Computed(WEIGHTED_TSV, persisted=True),
            nullable=False,
        ),
    )
    op.create_index("ix_chunks_tsv", "chunks", ["tsv"], postgresql_using="gin")
    op.create_index("ix_documents_assistant_id_sha256", "documents", ["assistant_id", "sha256"])


def downgrade() -> None:
    op.drop_index("ix_documents_assistant_id_sha256", table_name="documents")
    op.drop_index("ix_chunks_tsv", table_name="chunks")
    op.drop_column("chunks", "tsv")
    op.add_column(
        "chunks",
        sa.Column(
            "tsv",
            postgresql.TSVECTOR(),
            sa.Computed("to_tsvector('english', text)", persisted=True),
            nullable=False,
        ),
    )
    op.create_index("ix_chunks_tsv", "chunks", ["tsv"], postgresql_using="gin")
    op.drop_column("chunks", "paragraph_end")
    op.drop_column("chunks", "paragraph_start")
    op.drop_column("chunks", "context")
