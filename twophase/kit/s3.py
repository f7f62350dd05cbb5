"""The sink kit for a sink that writes to S3 (the S3 sink, the HTTP sink's staging, a lake
table on S3): the framework's one S3 client and its errors classified once.

=============================  ================================================================
piece                          what it does
=============================  ================================================================
:class:`S3Settings`            an S3 bucket and how to reach it (credentials out of ``repr``);
                               ``client()``: one boto3 client per process, endpoint,
                               credentials and attempt count (:data:`DEFAULT_S3_MAX_ATTEMPTS`
                               per request unless told otherwise), all of one boto3 session
:data:`S3_OPTIONS`             the options an S3 location takes (``S3Settings``' fields)
:data:`S3Checksums`            the checksum modes an S3 location takes
:class:`S3Errors`              every S3 error classified once (the fix names the caller's
                               permissions), and the codes a caller steers by
:func:`boto_errors`            the botocore errors to catch around boto3 calls
:func:`split_s3_location`      the bucket and the key or prefix of ``s3://bucket/...``
=============================  ================================================================

The client itself lives in the framework (:mod:`twophase._s3`: the state store on S3 uses it
too); boto3 is imported once a client is made, not by this module. ``__all__`` is this
family's public API. Until 0.6.0 each name also imports from :mod:`twophase.kit` (where the
flat kit had it), with a :class:`DeprecationWarning` naming this module.
"""

from __future__ import annotations

from twophase._s3 import (
    DEFAULT_S3_MAX_ATTEMPTS,
    S3_OPTIONS,
    S3Checksums,
    S3Errors,
    S3Settings,
    boto_errors,
    split_s3_location,
)

__all__ = [
    "DEFAULT_S3_MAX_ATTEMPTS",
    "S3_OPTIONS",
    "S3Checksums",
    "S3Errors",
    "S3Settings",
    "boto_errors",
    "split_s3_location",
]
