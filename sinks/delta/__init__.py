"""Delta Lake tables, exactly once by one Delta commit per batch: :class:`DeltaSink`.

::

    from sinks.delta import DeltaSink

    sink = DeltaSink("/data/lake/orders", create=True, partition_by=("status",))

``pip install twophase[delta]`` (deltalake, delta-rs: no JVM). One module per role, as
:mod:`sinks.postgres`:

==============  ================================================================================
module          role
==============  ================================================================================
``sink``        :class:`DeltaSink`: the phases, and what a crash at each one leaves
``committer``   the driver's side: one commit per batch, the proof, abort, in doubt, deadlines
``snapshot``    the Delta log: app ids, the proof on one loaded version, the commit
``files``       Parquet files named by transaction id in the data area, written, deleted
``storage``     the kit's lake storage (a local directory or an S3 prefix) from the options
``stats``       exact file statistics (``numRecords``, ``nullCount``, min/max where exact)
``schema``      Spark types against the table's, refused features, creating the table
``errors``      every deltalake, pyarrow and file system error, classified once
==============  ================================================================================
"""

from sinks.delta.sink import DeltaSink

__all__ = ["DeltaSink"]
