"""Documents record why they failed (transient or permanent) and who holds their lease.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None


def upgrade() -> None:
    # TRANSIENT: a dependency was down, the reconciler retries; PERMANENT: the file is bad.
    op.add_column("documents", sa.Column("failure_kind", sa.String(16), nullable=True))
    # How many times the reconciler re-sent a document that failed for a transient reason.
    op.add_column(
        "documents",
        sa.Column("reconcile_attempts", sa.Integer(), nullable=False, server_default="0"),
    )
    # "hostname:pid:task_id" of the attempt holding the lease, so a redelivered task or the
    # reconciler can tell that the holder is gone without waiting for the lease to run out.
    op.add_column("documents", sa.Column("lease_holder", sa.String(255), nullable=True))
    op.create_index(
        "ix_documents_state_failure_kind", "documents", ["state", "failure_kind"], unique=False
    )


def downgrade() -> None:
    op.drop_index("ix_documents_state_failure_kind", table_name="documents")
    op.drop_column("documents", "lease_holder")
    op.drop_column("documents", "reconcile_attempts")
    op.drop_column("documents", "failure_kind")
