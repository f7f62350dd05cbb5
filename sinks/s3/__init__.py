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
``errors``      every S3 error code and how it is classified: the one place
``connection``  settings (credentials hidden) and one boto3 client per process
==============  ===========================================================================
"""

from sinks.s3.committer import S3Committer
from sinks.s3.connection import S3Settings
from sinks.s3.formats import FORMATS, arrow_type, unencodable
from sinks.s3.keys import DEFAULT_KEY_TEMPLATE, KeyTemplate
from sinks.s3.sink import DEFAULT_PART_SIZE, S3_MIN_PART_SIZE, S3Sink, S3Transaction
from sinks.s3.upload import META_TXN, PartUploader

__all__ = [
    "DEFAULT_KEY_TEMPLATE",
    "DEFAULT_PART_SIZE",
    "FORMATS",
    "META_TXN",
    "S3_MIN_PART_SIZE",
    "KeyTemplate",
    "PartUploader",
    "S3Committer",
    "S3Settings",
    "S3Sink",
    "S3Transaction",
    "arrow_type",
    "unencodable",
]
