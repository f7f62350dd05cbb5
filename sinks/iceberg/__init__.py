"""Apache Iceberg tables, exactly once by one snapshot per batch: :class:`IcebergSink`.

::

    from sinks.iceberg import IcebergSink

    sink = IcebergSink("db.orders", catalog={"type": "sql", "uri": "postgresql+psycopg://...",
                                             "warehouse": "s3://lake/warehouse"}, create=True)

``pip install twophase[iceberg]`` (pyiceberg: no JVM). One module per role, as
:mod:`sinks.delta`:

==============  ================================================================================
module          role
==============  ================================================================================
``sink``        :class:`IcebergSink`: the phases, and what a crash at each one leaves
``committer``   the driver's side: one snapshot per batch, abort, in doubt, deadlines
``snapshots``   the proof (a walk of the snapshots since the batch's predecessor, the table
                property that survives expiry), the ``DataFile`` of each written file, and
                the one conditional catalog attempt
``files``       Parquet files with the table's field ids, named by transaction id, their footers
``layout``      what the executors need of the table, in plain values (no pyiceberg import)
``catalog``     the driver's catalog client, the table loaded or created
``local_commit`` a batch's snapshot swapped in by a sink group's local transaction of the SQL
                catalog's PostgreSQL database (a staged table visible in the same instant)
``schema``      Spark types against the table's, refused settings, creating the table
``errors``      every pyiceberg, catalog, pyarrow and file system error, classified once
==============  ================================================================================
"""

from sinks.iceberg.sink import IcebergSink

__all__ = ["IcebergSink"]
