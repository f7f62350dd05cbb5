"""AWS S3 and S3-compatible stores: one object per partition and batch, by multipart upload.

Every partition's slice of a micro-batch becomes ONE object, written as a multipart upload
while the rows stream in (:mod:`~sinks.s3.upload`: a bounded part buffer, a few parts in
flight), encoded as Parquet, CSV or JSON Lines (:mod:`~sinks.s3.formats`). An incomplete
upload is invisible to every reader (no HEAD, no listing, no GET): pre-commit uploads the last
part and hands the driver the upload id and the part ETags; commit is
``CompleteMultipartUpload``. The key comes from the transaction id (:mod:`~sinks.s3.keys`) and
the transaction id is also the object's metadata: the proof that a commit happened.

What a crash leaves behind, phase by phase (the store itself keeps what it acknowledged):

==========  ===================  =====================  ====================  ====================
phase       calls                a crash here leaves    resolved by           raises
==========  ===================  =====================  ====================  ====================
begin       none (the client is  nothing                (nothing to resolve)  ConfigurationError
            made on first use)                                                (bad options)
write       CreateMultipart-     an open upload with    listed by             RetryableError /
            Upload (first part,  some parts; invisible  ``list_in_doubt``     ConfigurationError
            txn id in metadata), (storage billed until  (key -> txn id),      from the error
            UploadPart per       aborted)               aborted by the        table, FatalError
            ``part_size`` bytes                         driver's sweep or     (over 10,000 parts)
                                                        cleanup
pre-commit  HeadObject (a reused an open upload with    as write; once the    FatalError (the id
            id), last            every part: durable,   handle is decided,    was committed once)
            UploadPart           invisible; an empty    the driver completes  as write
                                 partition: nothing     it
commit      HeadObject,          before complete: the   recovery commits      TransactionLostError
            CompleteMultipart-   open upload. After:    again: HEAD finds the (upload gone, no
            Upload IfNoneMatch   the object, metadata   object naming this    object; another
            ``*``                = txn id               txn: ALREADY_         txn's object),
                                                        COMMITTED             RetryableError
abort       ListMultipart-       the upload, or         repeat it:            RetryableError
            Uploads (key),       nothing                NoSuchUpload is
            AbortMultipart-                             NOT_FOUND
            Upload
==========  ===================  =====================  ====================  ====================

An empty partition writes no bytes, creates no upload and leaves no object; its handle names
no upload, and its commit is ALREADY_COMMITTED every time (nothing to make visible: its zero
rows are visible already). The proof of commit is the object itself, so there is nothing to
purge (``purge_commit_records`` is 0); a deleted object makes a later recommit of its handle
lost, which is what it is.

Hazard: a bucket lifecycle rule ``AbortIncompleteMultipartUpload`` aborts pre-committed uploads
that wait longer than its days: if a driver stays down that long, decided batches are lost.
``check_schema`` refuses a rule shorter than ``min_incomplete_upload_days`` (default 7) that
covers the prefix. Keep one (longer) as the backstop for uploads that nothing else aborts.

Permissions (every call by role, and the IAM policy: :mod:`~sinks.s3.errors`): s3:PutObject,
s3:GetObject (HEAD), s3:ListBucket, s3:ListMultipartUploadParts,
s3:ListBucketMultipartUploads, s3:AbortMultipartUpload, s3:GetLifecycleConfiguration
(optional: without it the lifecycle check is skipped with a warning).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, ClassVar

from sinks.s3.batchlog import DEFAULT_SCHEME as DEFAULT_LOG_SCHEME
from sinks.s3.committer import S3Committer
from sinks.s3.errors import ERRORS, classify
from sinks.s3.formats import (
    CONTENT_TYPES,
    FORMATS,
    Compression,
    Encoder,
    Format,
    encoder,
    extension,
    unencodable,
)
from sinks.s3.keys import DEFAULT_KEY_TEMPLATE, KeyTemplate
from sinks.s3.upload import PartUploader, head, txn_of
from twophase import (
    Column,
    ConfigurationError,
    Handle,
    SchemaMismatchError,
    Secret,
    TransactionContext,
    TwoPhaseCommitSink,
    TxnId,
)
from twophase.kit import (
    DEFAULT_CHUNK_SIZE,
    ConnectionFields,
    SecretOption,
    TlsMode,
    classified,
    namespace_from,
    transaction_id_reused,
    validate_chunk_size,
)
from twophase.kit.s3 import DEFAULT_S3_MAX_ATTEMPTS, S3Checksums, S3Settings, boto_errors

if TYPE_CHECKING:
    import pyarrow as pa

log = logging.getLogger(__name__)

MIB = 1024 * 1024
#: S3's minimum for every part but the last; S3-compatible stores and test servers may differ.
S3_MIN_PART_SIZE = 5 * MIB
DEFAULT_PART_SIZE = 8 * MIB
DEFAULT_MAX_IN_FLIGHT = 2
DEFAULT_MIN_INCOMPLETE_UPLOAD_DAYS = 7
#: What ``connection=`` may give: the sink's own connection options of these names.
CONNECTION_OPTIONS = ("endpoint_url", "region", "path_style", "access_key_id",
                      "secret_access_key", "session_token", "tls", "ca_bundle", "client_cert",
                      "client_key")
#: The secret ones: from ``connection=Secret(...)``, references read at every connection.
SECRET_OPTIONS = frozenset({"access_key_id", "secret_access_key", "session_token"})
#: ``connection=``: the connection options as one value (:class:`twophase.kit.ConnectionFields`).
CONNECTION = ConnectionFields("S3Sink", CONNECTION_OPTIONS, secrets=SECRET_OPTIONS)


@dataclass
class S3Transaction:
    """One partition's open object (lives on the executor between begin and pre-commit)."""

    txn_id: TxnId
    key: str
    uploader: PartUploader
    encoder: Encoder


class S3Sink(TwoPhaseCommitSink[S3Transaction]):
    """Exactly-once objects in ``s3://bucket/prefix``, one per partition and batch.

    ``format``: ``"parquet"`` (default), ``"csv"`` or ``"jsonl"``; ``compression="gzip"`` for
    CSV and JSON Lines. ``key_template`` must keep ``{txn}``. Connection: ``endpoint_url``,
    ``region``, ``path_style`` (S3-compatible stores), credentials from the options or boto3's
    chain (``access_key_id``, ``secret_access_key`` and ``session_token`` may be
    :class:`~twophase.Secret` references, read again should the store refuse rotated keys).
    TLS (every prebuilt sink's options): ``tls="verify"`` (the default) verifies the
    certificate and host name, against ``ca_bundle`` (a private CA's file) if given;
    ``tls="require"`` turns the check off (``"off"``: an ``http://`` endpoint only);
    ``client_cert``/``client_key`` present a client certificate. (The former ``verify=False``
    works and warns until 0.6.0.) ``connection``: those connection options
    (:data:`CONNECTION_OPTIONS`) as one value, a mapping of their names or a
    :class:`twophase.Secret` holding a JSON object of them (``Secret(env="S3_CONNECTION")``):
    read as the sink is made, but its ``access_key_id``, ``secret_access_key`` and
    ``session_token`` stay references (:class:`twophase.kit.SecretField`), read from the
    Secret whenever a client is made (rotated keys too); an option given there and as a
    keyword too is refused. ``part_size`` bytes per part
    (at least ``min_part_size``, S3's 5 MiB),
    ``max_in_flight`` parts uploading per task at once. ``batch_log=True``: after each batch,
    Spark's file sink log under the prefix (``_spark_metadata``; reader paths are
    ``batch_log_root/key``, by default ``s3a://bucket/key``), so ``spark.read`` of the prefix
    sees exactly the committed batches, and each batch has a manifest
    (see :mod:`~sinks.s3.batchlog`).
    """

    kind: ClassVar[str] = "s3"

    def __init__(
        self,
        bucket: str,
        prefix: str = "",
        *,
        format: Format = "parquet",
        compression: Compression = None,
        key_template: str = DEFAULT_KEY_TEMPLATE,
        connection: str | Secret | Mapping[str, Any] | None = None,
        endpoint_url: str | None = None,
        region: str | None = None,
        path_style: bool | None = None,
        access_key_id: SecretOption | None = None,
        secret_access_key: SecretOption | None = None,
        session_token: SecretOption | None = None,
        tls: TlsMode | None = None,
        ca_bundle: str | None = None,
        client_cert: str | None = None,
        client_key: str | None = None,
        part_size: int = DEFAULT_PART_SIZE,
        min_part_size: int = S3_MIN_PART_SIZE,
        max_in_flight: int = DEFAULT_MAX_IN_FLIGHT,
        chunk_size: int = DEFAULT_CHUNK_SIZE,
        checksums: S3Checksums = "when_required",
        max_attempts: int = DEFAULT_S3_MAX_ATTEMPTS,
        min_incomplete_upload_days: int = DEFAULT_MIN_INCOMPLETE_UPLOAD_DAYS,
        batch_log: bool = False,
        batch_log_root: str | None = None,
        verify: bool | None = None,
    ) -> None:
        if not bucket:
            raise ConfigurationError("S3Sink needs a bucket.", fix="pass bucket='my-bucket'")
        if format not in FORMATS:
            raise ConfigurationError(f"S3Sink: unknown format {format!r}.",
                                     fix=f"use one of {', '.join(FORMATS)}")
        if compression not in (None, "gzip") or (compression and format == "parquet"):
            raise ConfigurationError(
                f"S3Sink: compression={compression!r} is not possible for {format}.",
                fix="use compression='gzip' with csv or jsonl, None with parquet (Parquet "
                "compresses its pages itself)")
        if not isinstance(part_size, int) or part_size < min_part_size:
            raise ConfigurationError(
                f"S3Sink: part_size={part_size!r} is below the store's minimum part size "
                f"({min_part_size} bytes): completing the upload would fail.",
                fix=f"use part_size >= {min_part_size} (default {DEFAULT_PART_SIZE})")
        self.settings = S3Settings(bucket=bucket, **CONNECTION.read(connection, {
            "endpoint_url": endpoint_url, "region": region, "path_style": path_style,
            "access_key_id": access_key_id, "secret_access_key": secret_access_key,
            "session_token": session_token, "tls": tls, "ca_bundle": ca_bundle,
            "client_cert": client_cert, "client_key": client_key}),
            verify=verify, checksums=checksums)
        self.prefix = prefix.strip("/")
        self.format: Format = format
        self.compression: Compression = compression
        self.keys = KeyTemplate(key_template, prefix=self.prefix,
                                ext=extension(format, compression))
        self.part_size = part_size
        self.max_in_flight = max(0, int(max_in_flight))
        self.chunk_size = validate_chunk_size("S3Sink", chunk_size)
        self.max_attempts = max_attempts
        self.min_incomplete_upload_days = min_incomplete_upload_days
        #: Where reader paths in Spark's log start (``s3a://bucket``); None: no log.
        self.batch_log_root = (batch_log_root or f"{DEFAULT_LOG_SCHEME}://{bucket}").rstrip("/") \
            if batch_log else None

    def __repr__(self) -> str:
        return (f"S3Sink({self.settings.where}/{self.prefix}, format={self.format!r}, "
                f"compression={self.compression!r})")

    @property
    def where(self) -> str:
        return self.settings.where

    def default_namespace(self) -> str:
        name = self.prefix.rsplit("/", 1)[-1] or self.settings.bucket
        return namespace_from(name, self.kind)

    def _client(self) -> Any:
        return self.settings.client(max_attempts=self.max_attempts)

    # -- before the start ---------------------------------------------------------------------

    def check_schema(self, columns: Sequence[Column]) -> None:
        bad = unencodable(self.format, columns)
        if bad:
            raise SchemaMismatchError(
                f"S3Sink: {self.format} cannot hold column(s) {', '.join(bad)}.",
                fix="cast or serialise them in the query (to_json(col), base64(col)), or use "
                "format='parquet' / 'jsonl'")
        self.check_target()

    def check_target(self) -> None:
        """The bucket exists, the credentials work, uploads can be listed, no lifecycle rule
        aborts pre-committed uploads too early."""
        client, bucket, where = self._client(), self.settings.bucket, self.settings.where
        with classified(classify, f"HeadBucket of {where}", boto_errors()):
            try:
                client.head_bucket(Bucket=bucket)
            except boto_errors() as exc:
                if ERRORS.code(exc) in ("404", ERRORS.NO_SUCH_BUCKET):  # a HEAD's 404: no body
                    raise ERRORS.error(ERRORS.NO_SUCH_BUCKET, f"HeadBucket of {where}") from exc
                raise
        with classified(classify, f"ListMultipartUploads of {where}", boto_errors()):
            client.list_multipart_uploads(Bucket=bucket, Prefix=self.prefix, MaxUploads=1)
        self._check_lifecycle(client)

    def _check_lifecycle(self, client: Any) -> None:
        where = self.settings.where
        try:
            rules = client.get_bucket_lifecycle_configuration(
                Bucket=self.settings.bucket).get("Rules", [])
        except boto_errors() as exc:
            if ERRORS.code(exc) != ERRORS.NO_LIFECYCLE:
                log.warning("cannot read the lifecycle rules of %s (%s): not checking that "
                            "no rule aborts pre-committed uploads early", where,
                            ERRORS.code(exc) or exc)
            return
        for rule in rules:
            days = rule.get("AbortIncompleteMultipartUpload", {}).get("DaysAfterInitiation")
            scope = rule.get("Filter", {}).get("Prefix", rule.get("Prefix", ""))
            covers = self.prefix.startswith(scope) or scope.startswith(self.prefix)
            if (rule.get("Status") == "Enabled" and days is not None and covers
                    and days < self.min_incomplete_upload_days):
                raise ConfigurationError(
                    f"S3Sink: lifecycle rule {rule.get('ID', '?')!r} of {where} aborts "
                    f"incomplete multipart uploads under {scope!r} after {days} day(s): a "
                    "batch decided while the driver is down longer than that would be lost.",
                    fix=f"raise its DaysAfterInitiation to at least "
                    f"{self.min_incomplete_upload_days}, or scope it away from prefix "
                    f"{self.prefix!r} (or lower min_incomplete_upload_days= knowingly)")

    # -- executor -----------------------------------------------------------------------------

    def begin_transaction(self, ctx: TransactionContext) -> S3Transaction:
        unknown = unencodable(self.format, ctx.columns)
        if unknown:
            raise SchemaMismatchError(f"S3Sink: {self.format} cannot hold {', '.join(unknown)}.",
                                      fix="cast them in the query, or use format='parquet'")
        key = self.keys.key(ctx.txn_id)
        uploader = PartUploader(
            self._client(), self.settings.bucket, key, str(ctx.txn_id),
            part_size=self.part_size, max_in_flight=self.max_in_flight,
            content_type=CONTENT_TYPES[self.format], where=self.settings.where)
        return S3Transaction(ctx.txn_id, key, uploader, encoder(
            self.format, uploader, ctx.columns, compression=self.compression,
            chunk_size=self.chunk_size))

    def write(self, txn: S3Transaction, rows: Iterable[Sequence[Any]]) -> None:
        txn.encoder.write_rows(rows)

    def write_arrow(self, txn: S3Transaction, batches: Iterable[pa.RecordBatch]) -> None:
        txn.encoder.write_batches(batches)

    def pre_commit(self, txn: S3Transaction) -> Handle:
        txn.encoder.close()
        client, bucket = self._client(), self.settings.bucket
        existing = head(client, self.settings, txn.key)
        if existing is not None:
            txn.uploader.abort()
            log.error("s3://%s/%s exists (transaction %s)", bucket, txn.key, txn_of(existing))
            raise transaction_id_reused(txn.txn_id, where=f"{self.where} (s3://{bucket}/"
                                        f"{txn.key} exists)")
        upload = txn.uploader.finish()
        if upload is None:
            return self.handle(txn.txn_id, 0, bucket=bucket, key=txn.key, upload_id=None,
                               parts=[], size=0)
        return self.handle(txn.txn_id, txn.encoder.rows, bucket=bucket, key=txn.key,
                           upload_id=upload.upload_id,
                           parts=[[n, etag] for n, etag in upload.parts], size=upload.size)

    def discard(self, txn: S3Transaction) -> None:
        try:
            txn.uploader.abort()
        except Exception:
            log.warning("discard of %s: its upload stays until a sweep or cleanup aborts it",
                        txn.txn_id, exc_info=True)

    # -- driver: everything in the committer --------------------------------------------------

    #: Deprecated on the sink (removed in 0.6.0): call it on ``sink.committer()``.
    moved_to_committer = frozenset({"list_in_doubt"})

    def committer(self) -> S3Committer:
        return S3Committer(self)
