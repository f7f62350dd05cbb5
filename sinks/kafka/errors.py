"""Every Kafka error the sink meets, classified once, here.

=========================================  ====================================================
what went wrong                            what the sink raises
=========================================  ====================================================
CONCURRENT_TRANSACTIONS, a coordinator     :class:`RetryableError` (the broker is finishing a
loading / moved, NOT_ENOUGH_REPLICAS,      transaction or moving a partition; retried with
a request timeout, no connection           backoff by twophase)
PRODUCER_FENCED, INVALID_PRODUCER_EPOCH    :class:`TransactionLostError` on commit (through
(EndTxn of a decided transaction)          :func:`~twophase.kit.transaction_lost`, naming the
                                           deadline); :class:`FatalError` in a task (another
                                           attempt took the transactional id over)
INVALID_TXN_STATE                          as PRODUCER_FENCED on commit (aborted already)
UNKNOWN_TOPIC_OR_PARTITION, a producer     :class:`ConfigurationError`: create the topic
that found no metadata for a topic         (auto-create is off on sane clusters)
MESSAGE_SIZE_TOO_LARGE, RECORD_LIST_TOO_   :class:`SchemaMismatchError`: the fix names
LARGE                                      ``max_request_size`` and the topic's
                                           ``max.message.bytes``
INVALID_TRANSACTION_TIMEOUT                :class:`ConfigurationError`: lower
                                           ``transaction_timeout_ms``
an unknown or invalid ``producer_configs``  :class:`ConfigurationError` (librdkafka's
property                                   ``_INVALID_ARG``)
an authorization failure (TOPIC_, TRANS-    :class:`ConfigurationError` naming the ACL to grant
ACTIONAL_ID_, CLUSTER_AUTHORIZATION_       (:mod:`~sinks.kafka.access` lists them all)
FAILED)
a SASL failure, a TLS handshake refused     :class:`ConfigurationError` (credentials, CA, host
                                           name; a certificate is checked first by
                                           :meth:`~sinks.kafka.connection.KafkaSettings.
                                           verify_tls`); a SASL failure after the password's
                                           Secret changed: the admin client is made again
                                           with the new one (:func:`refused_credentials`)
a refused SASL login that kafka-python      the brokers asked by one login of the sink's own
reports as a broker not reached (or as      (:func:`login_in_question`,
refused, without the user)                  :mod:`~sinks.kafka.login`): their refusal, naming
                                           the user, as above
the broker's TLS alert refusing the client  :func:`client_certificate_refused`:
certificate (none given, or untrusted)      :class:`ConfigurationError` naming
                                           ``client_cert=``/``client_key=``
anything else                              :class:`FatalError` (never retried blindly)
=========================================  ====================================================

A broker error is named by its protocol name (``exc.message`` in kafka-python), a client-side
one by its class name; librdkafka's (the executors' producer) by ``KafkaError.name()``, mapped
to those names by :data:`LIBRDKAFKA_NAMES`. Messages carry the broker's words, never
credentials (neither client's errors carry them).
"""

from __future__ import annotations

import ssl

import kafka.errors as kerrors
from confluent_kafka import KafkaError, KafkaException

from twophase import (
    ConfigurationError,
    FatalError,
    RetryableError,
    SchemaMismatchError,
    TwoPhaseError,
)
from twophase.kit import ErrorTable

SYSTEM = "KafkaSink"

# -- codes the sink steers by (EndTxn, InitProducerId answers) --------------------------------
NONE = 0
CONCURRENT_TRANSACTIONS = "CONCURRENT_TRANSACTIONS"
PRODUCER_FENCED = "PRODUCER_FENCED"
INVALID_PRODUCER_EPOCH = "INVALID_PRODUCER_EPOCH"
INVALID_TXN_STATE = "INVALID_TXN_STATE"
TRANSACTIONAL_ID_NOT_FOUND = "TRANSACTIONAL_ID_NOT_FOUND"
TOPIC_AUTHORIZATION_FAILED = "TOPIC_AUTHORIZATION_FAILED"
SASL_AUTHENTICATION_FAILED = "SASL_AUTHENTICATION_FAILED"
#: A producer found no metadata for a topic within max_block_ms (no such topic, auto-create off).
NO_TOPIC_METADATA = "NO_TOPIC_METADATA"
#: kafka-python's failures to reach a broker: also its words for a refused SASL login (it loses
#: the broker's answer, see :mod:`~sinks.kafka.login`).
UNREACHED = frozenset({"KafkaConnectionError", "NodeNotReadyError", "KafkaTimeoutError"})
#: EndTxn answers that mean "this (producer id, epoch) can no longer decide the transaction".
GONE = frozenset({PRODUCER_FENCED, INVALID_PRODUCER_EPOCH, INVALID_TXN_STATE,
                  TRANSACTIONAL_ID_NOT_FOUND, "UNKNOWN_PRODUCER_ID",
                  "INVALID_PRODUCER_ID_MAPPING"})

FIX_RETRY = "retried automatically; if it persists, check that the brokers are up and reachable"
FIX_CONNECT = ("retried automatically; if it persists, check bootstrap_servers= and that the "
               "brokers are up and reachable from this host; with SASL, check "
               "sasl_plain_username= and sasl_plain_password= too")
FIX_TOPIC = ("create the topic (kafka-topics.sh --create --topic ...) or fix topic= / the "
             "topic column: the sink never creates data topics, and clusters should run with "
             "auto.create.topics.enable=false")
FIX_SIZE = ("shrink the record, or raise the producer's message.max.bytes (max_request_size) "
            "in producer_configs= and the topic's max.message.bytes together")
FIX_TIMEOUT = ("lower transaction_timeout_ms= to at most the brokers' "
               "transaction.max.timeout.ms, or raise that broker setting")
_ACLS = "kafka-acls.sh --bootstrap-server ... --add --allow-principal User:<sink's user>"
FIX_TOPIC_ACCESS = ("grant the sink's principal WRITE on the target topic and READ and WRITE on "
                    "the registry topic (registry_topic=, default twophase-kafka-transactions; "
                    "and CREATE on it unless it is created beforehand; DESCRIBE comes with "
                    "them): "
                    f"{_ACLS} --operation Write --topic <topic>, and --operation Read "
                    "--operation Write --topic <registry topic>")
FIX_TRANSACTIONAL_ID_ACCESS = ("grant the sink's principal WRITE on its transactional ids, a "
                               "PREFIXED ACL on transactional_id_prefix= (default twophase-): "
                               f"{_ACLS} --operation Write --transactional-id <prefix> "
                               "--resource-pattern-type prefixed")
FIX_CLUSTER_ACCESS = ("grant the sink's principal DESCRIBE_CONFIGS on the cluster (check_schema "
                      "reads the brokers' transaction.max.timeout.ms): "
                      f"{_ACLS} --operation DescribeConfigs --cluster; a transactional "
                      "producer needs no IDEMPOTENT_WRITE")
FIX_CREDENTIALS = ("check sasl_mechanism=, sasl_plain_username= and sasl_plain_password= (the "
                   "user must exist on the brokers for that mechanism)")
FIX_TLS = ("check ca_bundle= (the CA that issued the brokers' certificates) and that "
           "bootstrap_servers= names the brokers as their certificates do; "
           "ssl_check_hostname=False turns the host-name check off")
FIX_CLIENT_CERT_MISSING = (
    "the broker's listener requires a client certificate (ssl.client.auth=required): pass "
    "client_cert= the client certificate (PEM, issued by a CA of the brokers' "
    "ssl.truststore) and client_key= its key (ssl_password= if the key is encrypted)")
FIX_CLIENT_CERT_UNTRUSTED = (
    "pass client_cert= (and client_key=) a client certificate issued by a CA of the "
    "brokers' ssl.truststore, or have that CA added to it")
#: OpenSSL's reasons for a broker's alert that refuses the client certificate (none, or one
#: it cannot verify): Java's TLS sends certificate_required (TLS 1.3), bad_certificate or
#: certificate_unknown.
CLIENT_CERT_ALERTS = frozenset({"TLSV13_ALERT_CERTIFICATE_REQUIRED", "SSLV3_ALERT_BAD_CERTIFICATE",
                                "SSLV3_ALERT_CERTIFICATE_UNKNOWN", "TLSV1_ALERT_UNKNOWN_CA"})
FIX_TAKEN_OVER = ("another attempt took over this transactional id; the task is retried with "
                  "a fresh one; if it keeps happening, raise attempt_slots=")
FIX_CONFIG = "fix producer_configs= (librdkafka properties, e.g. linger.ms, batch.size)"
FIX_UNKNOWN_CODE = "look up the Kafka error code and fix its cause, then restart the query"

_RETRY = (RetryableError, FIX_RETRY)
_CONNECT = (RetryableError, FIX_CONNECT)
ERRORS = ErrorTable(
    system=SYSTEM,
    default=(FatalError, FIX_UNKNOWN_CODE),
    rules={
        CONCURRENT_TRANSACTIONS: _RETRY,
        "COORDINATOR_LOAD_IN_PROGRESS": _RETRY,
        "COORDINATOR_NOT_AVAILABLE": _RETRY,
        "NOT_COORDINATOR": _RETRY,
        "NOT_ENOUGH_REPLICAS": _RETRY,
        "NOT_ENOUGH_REPLICAS_AFTER_APPEND": _RETRY,
        "REQUEST_TIMED_OUT": _RETRY,
        "NOT_LEADER_FOR_PARTITION": _RETRY,
        "LEADER_NOT_AVAILABLE": _RETRY,
        "NETWORK_EXCEPTION": _RETRY,
        "THROTTLING_QUOTA_EXCEEDED": _RETRY,
        "KafkaConnectionError": _CONNECT,
        "NodeNotReadyError": _CONNECT,
        "NoBrokersAvailable": _CONNECT,
        "KafkaTimeoutError": _CONNECT,
        PRODUCER_FENCED: (FatalError, FIX_TAKEN_OVER),
        INVALID_PRODUCER_EPOCH: (FatalError, FIX_TAKEN_OVER),
        "TRANSACTION_ABORTABLE": (FatalError, FIX_TAKEN_OVER),
        INVALID_TXN_STATE: (FatalError, FIX_UNKNOWN_CODE),
        "UNKNOWN_TOPIC_OR_PARTITION": (ConfigurationError, FIX_TOPIC),
        NO_TOPIC_METADATA: (ConfigurationError, f"{FIX_TOPIC}; if it exists, the brokers were "
                            "unreachable for max_block_ms=: check them, then restart"),
        "INVALID_TOPIC": (ConfigurationError, FIX_TOPIC),
        "MESSAGE_SIZE_TOO_LARGE": (SchemaMismatchError, FIX_SIZE),
        "RECORD_LIST_TOO_LARGE": (SchemaMismatchError, FIX_SIZE),
        "INVALID_TRANSACTION_TIMEOUT": (ConfigurationError, FIX_TIMEOUT),
        "INVALID_CONFIG": (ConfigurationError, FIX_CONFIG),
        TOPIC_AUTHORIZATION_FAILED: (ConfigurationError, FIX_TOPIC_ACCESS),
        "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": (ConfigurationError,
                                                  FIX_TRANSACTIONAL_ID_ACCESS),
        "CLUSTER_AUTHORIZATION_FAILED": (ConfigurationError, FIX_CLUSTER_ACCESS),
        SASL_AUTHENTICATION_FAILED: (ConfigurationError, FIX_CREDENTIALS),
        "TLS_HANDSHAKE_FAILED": (ConfigurationError, FIX_TLS),
    },
)

#: What :func:`twophase.kit.classified` should catch around kafka-python and librdkafka calls.
KAFKA_ERRORS: tuple[type[BaseException], ...] = (kerrors.KafkaError, KafkaException)

#: librdkafka's names (``KafkaError.name()``) that differ from the protocol's, and its own
#: client-side ones (leading underscore), as the table above names them.
LIBRDKAFKA_NAMES = {
    "MSG_SIZE_TOO_LARGE": "MESSAGE_SIZE_TOO_LARGE",
    "UNKNOWN_TOPIC_OR_PART": NO_TOPIC_METADATA,
    "_UNKNOWN_TOPIC": NO_TOPIC_METADATA,
    "_UNKNOWN_PARTITION": NO_TOPIC_METADATA,
    "_FENCED": PRODUCER_FENCED,
    "_TRANSPORT": "KafkaConnectionError",
    "_ALL_BROKERS_DOWN": "NoBrokersAvailable",
    "_RESOLVE": "NoBrokersAvailable",
    "_MSG_TIMED_OUT": "KafkaTimeoutError",
    "_TIMED_OUT": "KafkaTimeoutError",
    "_INVALID_ARG": "INVALID_CONFIG",
    "_AUTHENTICATION": SASL_AUTHENTICATION_FAILED,
    "_SSL": "TLS_HANDSHAKE_FAILED",
}

#: kafka-python's words when a producer finds no metadata for a topic (auto-create off).
_NO_TOPIC_METADATA = "Failed to update metadata"


def code_of(exc: BaseException | type[BaseException]) -> str:
    """The protocol name of a broker error (``PRODUCER_FENCED``), else the class name."""
    kind = exc if isinstance(exc, type) else type(exc)
    if issubclass(kind, kerrors.BrokerResponseError):
        return str(getattr(kind, "message", kind.__name__))
    return kind.__name__


def code_name(error_code: int) -> str:
    """The protocol name of a numeric error code in a response (``NONE`` for 0)."""
    return "NONE" if error_code == NONE else code_of(kerrors.for_code(error_code))


def classify(exc: BaseException, what: str) -> TwoPhaseError:
    """The one verdict on a kafka-python or librdkafka error raised during ``what``."""
    if isinstance(exc, KafkaException):
        return _classify_librdkafka(exc, what)
    code = code_of(exc)
    if code == "KafkaTimeoutError" and _NO_TOPIC_METADATA in str(exc):
        code = NO_TOPIC_METADATA
    return ERRORS.error(code, what, f"{code} ({exc})")


def refused_credentials(exc: BaseException) -> bool:
    """Whether the brokers refused the SASL login (either client): a rotated password is read
    again (:func:`twophase.kit.retried_if_rotated`)."""
    if isinstance(exc, KafkaException):
        error = exc.args[0] if exc.args else None
        return isinstance(error, KafkaError) and \
            LIBRDKAFKA_NAMES.get(error.name()) == SASL_AUTHENTICATION_FAILED
    return code_of(exc) == SASL_AUTHENTICATION_FAILED


def login_in_question(exc: BaseException) -> bool:
    """Whether kafka-python's ``exc`` (or, for a twophase error, the error it was classified
    from) may be a refused SASL login: it failed to reach a broker (its words for a refusal
    whose answer it lost), or it says the broker refused (naming no user)."""
    cause = exc.__cause__ if isinstance(exc, TwoPhaseError) else exc
    return isinstance(cause, kerrors.KafkaError) and \
        code_of(cause) in UNREACHED | {SASL_AUTHENTICATION_FAILED}


def no_connection_ready(exc: BaseException) -> bool:
    """Whether kafka-python's ``exc`` (or, for a twophase error, the error it was classified
    from) says the request was never sent: every broker connection was waiting out its
    reconnect backoff (as after a broker that was down came back)."""
    cause = exc.__cause__ if isinstance(exc, TwoPhaseError) else exc
    return isinstance(cause, kerrors.NodeNotReadyError)


def client_certificate_refused(server: str, error: ssl.SSLError,
                               certfile: str | None) -> ConfigurationError | None:
    """The broker at ``server`` refused the TLS session over the client certificate (the sink
    presented ``certfile``, or none); None if ``error`` is not such an alert."""
    if error.reason not in CLIENT_CERT_ALERTS:
        return None
    if certfile is None:
        return ConfigurationError(
            f"{SYSTEM}: the broker at {server} requires a client certificate and none was given "
            f"(TLS alert {error.reason}).", fix=FIX_CLIENT_CERT_MISSING)
    return ConfigurationError(
        f"{SYSTEM}: the broker at {server} refuses the client certificate "
        f"client_cert={certfile!r} (TLS alert {error.reason}: it is not issued by a CA the "
        "broker trusts).", fix=FIX_CLIENT_CERT_UNTRUSTED)


def classify_code(error_code: int, what: str) -> TwoPhaseError:
    """The verdict on an error code in a response."""
    code = code_name(error_code)
    return ERRORS.error(code, what, code)


def _classify_librdkafka(exc: KafkaException, what: str) -> TwoPhaseError:
    error = exc.args[0] if exc.args else None
    if not isinstance(error, KafkaError):
        return ERRORS.error(type(exc).__name__, what, str(exc))
    name = error.name()
    if error.fatal() and name in {"_FENCED", "PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"}:
        name = PRODUCER_FENCED
    code = LIBRDKAFKA_NAMES.get(name, name)
    return ERRORS.error(code, what, f"{code} ({error.str()})")
