"""PostgreSQL >= 11, exactly once by prepared transactions: :class:`PostgresSink`.

::

    from sinks.postgres import PostgresSink

    sink = PostgresSink(host="db", user="etl", password=..., database="shop",
                        table="orders_live", mode="upsert", key=("order_id",))

``pip install twophase[postgres]`` (psycopg 3). One module per role, as :mod:`sinks.mysql`:

==================  =============================================================================
module              role
==================  =============================================================================
``sink``            :class:`PostgresSink`: the phases, and what a crash at each one leaves
``committer``       the driver's commits and aborts through pooled sessions; why no fence
``prepared``        gids, ``PREPARE TRANSACTION`` / ``COMMIT PREPARED``, ``pg_prepared_xacts``
``markers``         the marker row that proves a commit, its commit time and its purge
``staging``         the staged mode: rows staged per transaction, published in ONE local
                    transaction (shared with an Iceberg catalog in the same database)
``keyed``           the keyed mode: changes under row locks (prepared), the staged rows with
                    their delete flag and their application in SQL, the tombstone table
``bulk``            ``COPY`` (CSV from Arrow, or rows) and ``INSERT ... ON CONFLICT``
``errors``          every SQLSTATE and how it is classified: the one place
``locks``           who holds the lock a writer waited for (``lock_timeout``), named in its
                    error
``schema``          identifiers, the marker table's DDL, the checks before a start
``connection``      connecting: session settings (UTC, timeouts), TLS
==================  =============================================================================
"""

from sinks.postgres.schema import MARKER_TABLE_DDL
from sinks.postgres.sink import PostgresSink

__all__ = ["MARKER_TABLE_DDL", "PostgresSink"]
