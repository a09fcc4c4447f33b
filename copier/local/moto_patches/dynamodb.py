"""The moto patch for DynamoDB: creating a global secondary index that already exists is a no-op.

The KCL 3 workers starting together race to create the lease table's index
(see :func:`patch_duplicate_gsi_create`).
"""

from __future__ import annotations

from typing import Any

from moto.dynamodb.models import DynamoDBBackend

from copier.local.moto_patches.replace import replace

__all__ = ["patch_duplicate_gsi_create"]


def patch_duplicate_gsi_create() -> None:
    """UpdateTable creating a global secondary index that already exists is a no-op.

    moto raises a bare ValueError, which its server turns into an HTTP 500.
    When two KCL 3 workers start together, both see the lease table without
    its LeaseOwnerToLeaseKeyIndex and both ask UpdateTable to create it; the
    AWS SDK retries the 500 nine times and the KCL then fails that
    initialisation attempt. AWS answers such a race with a 4xx that the KCL
    survives (the index does get created); the no-op gives the same end
    state without the 500 storm. Other updates in the same call still apply.
    """
    original = DynamoDBBackend.update_table_global_indexes

    def update_table_global_indexes(self: Any, table: Any, global_index_updates: list[dict[str, Any]]) -> None:
        existing = {index.name for index in table.global_indexes}
        wanted = [u for u in global_index_updates if not (u.get("Create") and u["Create"]["IndexName"] in existing)]
        original(self, table, wanted)

    replace(DynamoDBBackend, "update_table_global_indexes", update_table_global_indexes)
