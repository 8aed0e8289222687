"""API keys and assistants with their settings.

Revision ID: 0001
Revises:
Create Date: 2026-11-22
"""

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "api_keys",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("key_hash", sa.String(64), nullable=False),
        sa.Column("prefix", sa.String(32), nullable=False),
        sa.Column("name", sa.String(200), nullable=False),
        sa.Column(
            "create_time", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False
        ),
        sa.Column("revoke_time", sa.DateTime(timezone=True), nullable=True),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_api_keys")),
        sa.UniqueConstraint("key_hash", name=op.f("uq_api_keys_key_hash")),
    )
    op.create_index(op.f("ix_api_keys_tenant_id"), "api_keys", ["tenant_id"])
    op.create_table(
        "assistants",
        sa.Column("id", sa.Uuid(), nullable=False),
        sa.Column("tenant_id", sa.String(128), nullable=False),
        sa.Column("display_name", sa.String(200), nullable=False),
        sa.Column("request_id", sa.String(128), nullable=True),
        sa.Column("create_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("update_time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("system_prompt", sa.Text(), nullable=False),
        sa.Column("model", sa.String(200), nullable=False),
        sa.Column("temperature", sa.Float(), nullable=False),
        sa.Column("max_output_tokens", sa.Integer(), nullable=False),
        sa.Column("enable_rag", sa.Boolean(), nullable=False),
        sa.Column("enable_citations", sa.Boolean(), nullable=False),
        sa.Column("citation_link_mode", sa.String(32), nullable=False),
        sa.Column("top_k", sa.Integer(), nullable=False),
        sa.Column("score_threshold", sa.Float(), nullable=False),
        sa.Column("max_sources", sa.Integer(), nullable=False),
        sa.Column("excerpt_chars", sa.Integer(), nullable=False),
        sa.Column("enable_retrieval_gate", sa.Boolean(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_assistants")),
        sa.UniqueConstraint(
            "tenant_id", "request_id", name=op.f("uq_assistants_tenant_id_request_id")
        ),
    )
    op.create_index(op.f("ix_assistants_tenant_id"), "assistants", ["tenant_id"])
    # Keyset pagination walks (tenant, create_time, id).
    op.create_index(
        "ix_assistants_tenant_id_create_time_id", "assistants", ["tenant_id", "create_time", "id"]
    )


def downgrade() -> None:
    op.drop_table("assistants")
    op.drop_table("api_keys")
