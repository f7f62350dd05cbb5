"""MySQL 8 / MariaDB >= 10.5, exactly once by XA: :class:`MySQLXASink`.

::

    from sinks.mysql import MySQLXASink

    sink = MySQLXASink(host="db", user="etl", password=..., database="shop",
                       table="orders_live", mode="keyed", key=("order_id",),
                       version="version")

One module per role (as Flink's JDBC ``xa`` package splits its sink):

====================  ===========================================================================
module                role
====================  ===========================================================================
``sink``              :class:`MySQLXASink`: the phases, and what a crash at each one leaves
``committer``         :class:`MySQLCommitter`: the driver's commits and aborts, pooled, fenced
``xa``                xids, the XA statements, reading ``XA RECOVER``
``markers``           the marker row that proves a commit, its stamp and its purge
``fencing``           the fence row that stops a zombie run's commits (``fencing=True``)
``bulk``              the two bulk statements: ``LOAD DATA LOCAL`` and multi-row ``INSERT``
``keyed``             ``mode="keyed"``: a chunk's changes applied where newer, tombstones
``encoding``          rows as ``LOAD DATA`` text and ``INSERT`` literals; time zones
``arrow``             record batches as ``LOAD DATA`` text, vectorised (needs pyarrow)
``errors``            every error code and how it is classified: the one place
``schema``            identifiers, the DDL of the sink's own tables, the checks before a start
``connection``        connecting: session settings (strict, UTC), TLS context, a small pool
====================  ===========================================================================
"""

from sinks.mysql.schema import FENCE_TABLE_DDL, MARKER_TABLE_DDL
from sinks.mysql.sink import MySQLXASink

__all__ = ["FENCE_TABLE_DDL", "MARKER_TABLE_DDL", "MySQLXASink"]
