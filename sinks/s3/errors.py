"""The S3 sink's errors and permissions: classified by twophase's one table of S3 errors
(:class:`twophase.kit.s3.S3Errors`, which the state store and the HTTP sink's S3 staging share),
whose fix for a refused request names the permission of the refused operation and all that
this sink needs.

The other modules read :meth:`~twophase.kit.S3Errors.code` / ``status`` of :data:`ERRORS` only
to steer (``NoSuchUpload``, ``PreconditionFailed``, 404 on HEAD), never to build an error of
their own. Credentials never appear in a message: botocore's errors do not carry them, and
:class:`~twophase.kit.s3.S3Settings` hides them from ``repr``.

Every S3 call of the sink, by role, and the IAM action it needs (least privilege: the README's
policy is :func:`iam_policy`):

=============  ==========================================  ==================================
role           calls                                       actions
=============  ==========================================  ==================================
check (driver  HeadBucket, ListMultipartUploads,           s3:ListBucket,
before start)  GetBucketLifecycleConfiguration             s3:ListBucketMultipartUploads,
                                                           s3:GetLifecycleConfiguration
                                                           (optional)
writer         CreateMultipartUpload, UploadPart,          s3:PutObject, s3:GetObject,
(executor)     HeadObject, AbortMultipartUpload (discard)  s3:AbortMultipartUpload
committer      HeadObject, CompleteMultipartUpload,        s3:GetObject, s3:PutObject,
(driver)       ListParts (after a failed complete)         s3:ListMultipartUploadParts
recovery,      ListMultipartUploads, AbortMultipartUpload, s3:ListBucketMultipartUploads,
cleanup,       HeadObject (and the committer's calls)      s3:AbortMultipartUpload,
status                                                     s3:GetObject
batch log      ListObjectsV2, GetObject, PutObject         s3:ListBucket, s3:GetObject,
(optional)     (under ``prefix/_spark_metadata``)          s3:PutObject
=============  ==========================================  ==================================
"""

from __future__ import annotations

from typing import Any

from twophase.kit.s3 import S3Errors

#: What the sink's credentials need on the bucket (s3:GetLifecycleConfiguration is optional:
#: without it the lifecycle check is skipped with a warning).
BUCKET_PERMISSIONS = ("s3:ListBucket", "s3:ListBucketMultipartUploads",
                      "s3:GetLifecycleConfiguration")
#: What the sink's credentials need on the objects under its prefix.
OBJECT_PERMISSIONS = ("s3:PutObject", "s3:GetObject", "s3:AbortMultipartUpload",
                      "s3:ListMultipartUploadParts")
PERMISSIONS = BUCKET_PERMISSIONS + OBJECT_PERMISSIONS
#: What a state on S3 needs on its prefix (:mod:`twophase._storage`).
STATE_PERMISSIONS = ("s3:GetObject", "s3:PutObject")
ERRORS = S3Errors(PERMISSIONS)
#: The one verdict on a boto3/botocore error raised during a step (``what``).
classify = ERRORS.classify
POLICY_VERSION = "2012-10-17"


def iam_policy(bucket: str, prefix: str, *, state_bucket: str | None = None,
               state_prefix: str | None = None) -> dict[str, Any]:
    """The least-privilege IAM policy of a sink writing under ``s3://bucket/prefix`` (and a
    state under ``s3://state_bucket/state_prefix``, if given)."""
    statements: list[dict[str, Any]] = [
        {"Sid": "SinkBucket", "Effect": "Allow", "Action": list(BUCKET_PERMISSIONS),
         "Resource": f"arn:aws:s3:::{bucket}"},
        {"Sid": "SinkObjects", "Effect": "Allow", "Action": list(OBJECT_PERMISSIONS),
         "Resource": _objects(bucket, prefix)}]
    if state_bucket is not None:
        statements.append({
            "Sid": "State", "Effect": "Allow", "Action": list(STATE_PERMISSIONS),
            "Resource": _objects(state_bucket, state_prefix or "")})
    return {"Version": POLICY_VERSION, "Statement": statements}


def _objects(bucket: str, prefix: str) -> str:
    """The ARN of every object under ``prefix`` of ``bucket``."""
    path = prefix.strip("/")
    return f"arn:aws:s3:::{bucket}/{path}/*" if path else f"arn:aws:s3:::{bucket}/*"
