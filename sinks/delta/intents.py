"""A transaction's intent: the small record, kept until the transaction is settled, of every
data file it created, so that finding what is in doubt never walks the table's data area.

An intent is ``_twophase/<namespace>/<txn id>.json`` under the table's root (a ``_`` folder:
Delta's readers and VACUUM ignore it; it never holds data), its body ``{"files": [paths]}``.

===========================================  =================================================
who                                          what
===========================================  =================================================
the executor, before it creates a data file  writes the intent again, listing the new file:
                                             every file a transaction created is named by
                                             its intent before it exists
abort (the executor's discard, the sweep)    deletes the files, then the intent
the committer, once a batch's commit is      deletes the intents of the batch's transactions
proven (``finish_batch``)
``list_in_doubt``                            lists the intents of a namespace; one whose
                                             transaction is proven committed (a crash
                                             between the commit and the deletion) is deleted
                                             on sight
===========================================  =================================================

So a data file of ours that no commit references always has an intent, and listing the
transactions in doubt costs one listing of ``_twophase/<namespace>/`` plus one read per
intent: it grows with the transactions not yet settled, never with the table's age.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence

from sinks.delta.storage import Storage
from twophase import TxnId

DIRECTORY = "_twophase"
SUFFIX = ".json"


def directory_of(namespace: str) -> str:
    return f"{DIRECTORY}/{namespace}"


def path_of(txn_id: TxnId) -> str:
    return f"{directory_of(txn_id.namespace)}/{txn_id}{SUFFIX}"


def record(storage: Storage, txn_id: TxnId, files: Sequence[str]) -> None:
    """The intent of ``txn_id``, listing ``files`` (written again for each new file)."""
    storage.put(path_of(txn_id), json.dumps({"files": list(files)}).encode())


def files_named(storage: Storage, txn_id: TxnId) -> list[str]:
    """The files the intent of ``txn_id`` lists (none: no intent)."""
    body = storage.get(path_of(txn_id))
    return [] if body is None else _files(body)


def forget(storage: Storage, txn_ids: Iterable[TxnId]) -> None:
    """Delete the intents of ``txn_ids`` (settled transactions)."""
    if paths := [path_of(txn_id) for txn_id in txn_ids]:
        storage.delete(paths)


def pending(storage: Storage, namespace: str) -> dict[TxnId, list[str]]:
    """Every intent of ``namespace``: its transaction and the files it lists."""
    found: dict[TxnId, list[str]] = {}
    for name in storage.names(directory_of(namespace)):
        txn_id = _txn_of(name)
        if txn_id is None or txn_id.namespace != namespace:
            continue
        body = storage.get(f"{directory_of(namespace)}/{name}")
        if body is not None:  # settled while we listed
            found[txn_id] = _files(body)
    return found


def _txn_of(name: str) -> TxnId | None:
    if not name.endswith(SUFFIX):
        return None
    try:
        return TxnId.parse(name.removesuffix(SUFFIX))
    except ValueError:
        return None


def _files(body: bytes) -> list[str]:
    files: list[str] = json.loads(body)["files"]
    return files
