"""The S3 sink's errors: classified by twophase's one table of S3 errors
(:class:`twophase.kit.S3Errors`, which the state store and the HTTP sink's S3 staging share),
whose fix for a refused request names the permissions this sink needs.

The other modules read :meth:`~twophase.kit.S3Errors.code` / ``status`` of :data:`ERRORS` only
to steer (``NoSuchUpload``, ``PreconditionFailed``, 404 on HEAD), never to build an error of
their own. Credentials never appear in a message: botocore's errors do not carry them, and
:class:`~twophase.kit.S3Settings` hides them from ``repr``.
"""

from __future__ import annotations

from twophase.kit import S3Errors

#: What the sink's credentials need on the bucket and prefix (s3:GetLifecycleConfiguration
#: is optional: without it the lifecycle check is skipped with a warning).
PERMISSIONS = ("s3:PutObject", "s3:GetObject", "s3:ListBucket", "s3:ListBucketMultipartUploads",
               "s3:AbortMultipartUpload")
ERRORS = S3Errors(PERMISSIONS)
#: The one verdict on a boto3/botocore error raised during a step (``what``).
classify = ERRORS.classify
