"""AWS S3 and S3-compatible stores, exactly once by multipart upload: :class:`S3Sink`.

::

    from sinks.s3 import S3Sink

    sink = S3Sink("analytics", "orders_live", format="parquet", region="eu-west-1")

One module per role:

==============  ===========================================================================
module          role
==============  ===========================================================================
``sink``        :class:`S3Sink`: the phases, and what a crash at each one leaves
``committer``   :class:`S3Committer`: the driver's completes and aborts, proven by HEAD
``upload``      the bounded part buffer and the multipart calls
``batchlog``    Spark's file sink log of the committed batches (``batch_log=True``)
``formats``     Parquet (from Arrow), CSV, JSON Lines (+ gzip); what each cannot hold
``keys``        object keys from a template; transaction ids read back from keys
``errors``      the permissions a refused request's fix names; every S3 error is
                classified by twophase's one S3 table (:class:`twophase.kit.s3.S3Errors`)
==============  ===========================================================================

Settings and clients are twophase's one S3 client (:class:`twophase.kit.s3.S3Settings`: one
boto3 session per process, one client per endpoint, credentials and attempt count).
"""

from sinks.s3.sink import S3Sink

__all__ = ["S3Sink"]
