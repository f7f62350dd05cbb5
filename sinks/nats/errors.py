"""Every NATS error the sink meets, classified once, here.

=============================================  ===============================================
what went wrong                                what the sink raises
=============================================  ===============================================
no server reached, a timeout, a connection     :class:`RetryableError` (retried with backoff
closed or reconnecting, no responders, the     by twophase)
JetStream API unavailable (503)
``wrong last sequence`` (10071) on a commit's  :class:`RetryableError`: another commit wrote
publish                                        the subject meanwhile; the retry resumes the
                                               chain from the subject's last message
a stream not found (10059), JetStream off      :class:`ConfigurationError`: create the target
for the account (10039), a subject no stream   stream / enable JetStream
captures
a stream name taken with another               :class:`ConfigurationError`: name another
configuration (10058), subjects that overlap   ``staging_stream=``
another stream's (10065)
account or stream limits reached (10002,       :class:`ConfigurationError`: raise the limit
10077, 10047, 10023 insufficient resources)    or give JetStream more storage
a message larger than the server's             :class:`SchemaMismatchError`: shrink the row or
``max_payload``                                raise ``max_payload``
authorization refused (a wrong password: the  :class:`ConfigurationError` naming the
server's ``Authorization Violation``), an      credential options
invalid creds file
a permission the server refuses (``-ERR        :class:`ConfigurationError` naming the
Permissions Violation``; nats-py only reports  permission to grant, from the sink's one list
it, and the request would time out)            (:func:`~sinks.nats.access.permissions`)
a TLS failure (handshake, certificate,         :class:`ConfigurationError` naming ``tls=``,
server requires / refuses TLS)                 ``ca_bundle=``, ``client_cert=``
anything else                                  :class:`FatalError` (never retried blindly)
=============================================  ===============================================

A JetStream API error is named by its error code (``APIError.err_code``: 10071), any other
error by its class name along its MRO (:meth:`~twophase.kit.ErrorTable.class_code`); nats-py's
plain ``Error`` by the server's words it carries (a wrong password is ``Error("nats:
'Authorization Violation'")``). Messages carry the server's words, never credentials (nats-py's
errors hold none).
"""

from __future__ import annotations

import re
import ssl
from collections.abc import Hashable
from typing import TYPE_CHECKING

import nats.errors
from nats.js.errors import APIError

from twophase import (
    ConfigurationError,
    FatalError,
    RetryableError,
    SchemaMismatchError,
    TwoPhaseError,
)
from twophase.kit import Condition, ErrorTable

if TYPE_CHECKING:
    from sinks.nats.access import Permissions

SYSTEM = "JetStreamSink"

# -- JetStream API error codes the sink steers by ----------------------------------------------
WRONG_LAST_SEQUENCE = 10071
STREAM_NOT_FOUND = 10059
NO_MESSAGE_FOUND = 10037
JETSTREAM_NOT_ENABLED = 10076
JETSTREAM_NOT_ENABLED_FOR_ACCOUNT = 10039
STREAM_NAME_IN_USE = 10058
SUBJECTS_OVERLAP = 10065
ACCOUNT_RESOURCES_EXCEEDED = 10002
#: The store refused a message: a stream's limit reached with discard=new ("maximum messages
#: exceeded", "maximum bytes exceeded").
STORE_FAILED = 10077
STORAGE_RESOURCES_EXCEEDED = 10047
INSUFFICIENT_RESOURCES = 10023

FIX_RETRY = "retried automatically; if it persists, check that the NATS servers are up"
FIX_CONNECT = ("retried automatically; if it persists, check servers= (nats://host:4222) and "
               "that the servers are up and reachable from this host")
FIX_RACE = ("retried automatically: another commit wrote the subject meanwhile, and the retry "
            "resumes the chain from the subject's last message; if it persists, make sure no "
            "other query or writer publishes to the sink's subject= (it is written by one "
            "query alone)")
FIX_STREAM = ("create the target stream capturing subject= (nats stream add <name> --subjects "
              "<subject> --storage file --retention limits), or pass stream= its name")
FIX_JETSTREAM = ("enable JetStream on the server (nats-server -js, or jetstream {} in its "
                 "configuration) and for the sink's account")
FIX_STAGING_NAME = ("pass staging_stream= a stream name of the sink's own: the name is taken by "
                    "a stream of another configuration, or its subjects overlap another's")
FIX_LIMITS = ("raise the account's or the stream's JetStream limits (max_msgs, max_bytes, "
              "max_file_store), or give the server more storage")
FIX_SIZE = ("shrink the row (or the value= column), or raise the servers' max_payload "
            "(1 MB by default)")
FIX_CREDENTIALS = ("check user= and password=, token=, nkeys_seed= or creds_file= (the user "
                   "must exist on the servers, with the permissions "
                   "sinks.nats.access.permissions lists)")
FIX_PERMISSIONS = ("grant the sink's user the permissions sinks.nats.access.permissions lists "
                   "(nats-server: authorization { users = [{ user, password, permissions }] })")
FIX_TLS = ("check tls=, ca_bundle= (the CA that issued the servers' certificates), "
           "client_cert= and client_key=, and that servers= names the hosts as their "
           "certificates do; tls='off' only where the servers take plain text on a trusted "
           "network")
FIX_SUBJECT = "pass subject= a literal subject (tokens of letters, digits, - and _; no * or >)"
FIX_UNKNOWN = "look up the NATS error and fix its cause, then restart the query"

_RETRY = (RetryableError, FIX_RETRY)
_CONNECT = (RetryableError, FIX_CONNECT)
_TLS = (ConfigurationError, FIX_TLS)
_LIMITS = (ConfigurationError, FIX_LIMITS)
#: The words of the server that nats-py raises as its plain ``Error`` (lower case: nats-py
#: lowers a permissions violation's).
AUTHORIZATION_VIOLATION = "authorization violation"
PERMISSIONS_VIOLATION = "permissions violation"
#: A permissions violation as nats-py reports it: ``nats: permissions violation for publish
#: to "subject"`` (or ``for subscription to``).
_DENIAL = re.compile(r'permissions violation for (publish|subscription) to "([^"]+)"',
                     re.IGNORECASE)
ERRORS = ErrorTable(
    system=SYSTEM,
    default=(FatalError, FIX_UNKNOWN),
    rules={
        WRONG_LAST_SEQUENCE: (RetryableError, FIX_RACE),
        STREAM_NOT_FOUND: (ConfigurationError, FIX_STREAM),
        JETSTREAM_NOT_ENABLED: (ConfigurationError, FIX_JETSTREAM),
        JETSTREAM_NOT_ENABLED_FOR_ACCOUNT: (ConfigurationError, FIX_JETSTREAM),
        STREAM_NAME_IN_USE: (ConfigurationError, FIX_STAGING_NAME),
        SUBJECTS_OVERLAP: (ConfigurationError, FIX_STAGING_NAME),
        ACCOUNT_RESOURCES_EXCEEDED: _LIMITS,
        STORE_FAILED: _LIMITS,
        STORAGE_RESOURCES_EXCEEDED: _LIMITS,
        INSUFFICIENT_RESOURCES: _LIMITS,
        "ServiceUnavailableError": _RETRY,
        "TimeoutError": _CONNECT,
        "NoServersError": _CONNECT,
        "ConnectionClosedError": _CONNECT,
        "ConnectionReconnectingError": _CONNECT,
        "StaleConnectionError": _CONNECT,
        "OutboundBufferLimitError": _RETRY,
        "FlushTimeoutError": _CONNECT,
        "NoRespondersError": (RetryableError, f"{FIX_RETRY}; a request nobody answered: "
                                              "JetStream may be starting"),
        "NoStreamResponseError": (ConfigurationError, FIX_STREAM),
        "ConnectionRefusedError": _CONNECT,
        "AuthorizationError": (ConfigurationError, FIX_CREDENTIALS),
        "InvalidUserCredentialsError": (ConfigurationError, FIX_CREDENTIALS),
        "MaxPayloadError": (SchemaMismatchError, FIX_SIZE),
        "BadSubjectError": (ConfigurationError, FIX_SUBJECT),
        "SecureConnRequiredError": _TLS,
        "SecureConnWantedError": _TLS,
        "SecureConnFailedError": _TLS,
        "SSLError": _TLS,
    },
    conditions={
        "Error": (Condition(AUTHORIZATION_VIOLATION, (ConfigurationError, FIX_CREDENTIALS)),
                  Condition(PERMISSIONS_VIOLATION, (ConfigurationError, FIX_PERMISSIONS))),
    },
)

#: What :func:`twophase.kit.classified` catches around nats-py calls: its own errors, a socket's
#: (refused, reset) and TLS's.
NATS_ERRORS: tuple[type[BaseException], ...] = (nats.errors.Error, OSError, ssl.SSLError)


def code_of(exc: BaseException) -> Hashable:
    """A JetStream API error's code (10071), else the most specific class name the table
    knows."""
    if isinstance(exc, APIError) and exc.err_code is not None:
        return exc.err_code
    return ERRORS.class_code(exc)


def classify(exc: BaseException, what: str) -> TwoPhaseError:
    """The one verdict on a nats-py error raised during ``what``."""
    code = code_of(exc)
    detail = str(exc).strip() or type(exc).__name__
    return ERRORS.error(code, what, f"[{code}] {detail}")


def is_api_error(exc: BaseException, err_code: int) -> bool:
    """Whether ``exc`` is the JetStream API's answer ``err_code``."""
    return isinstance(exc, APIError) and exc.err_code == err_code


def is_permissions_violation(exc: BaseException) -> bool:
    """Whether nats-py reported the server refusing the user a publish or a subscription."""
    return isinstance(exc, nats.errors.Error) and _DENIAL.search(str(exc)) is not None


def permission_denied(exc: BaseException, what: str,
                      required: Permissions | None) -> ConfigurationError:
    """A permissions violation (:func:`is_permissions_violation`) during ``what``, naming the
    permission to grant from the sink's list ``required`` (all of it, too)."""
    found = _DENIAL.search(str(exc))
    operation, subject = ("publish" if found is None or found[1].lower() == "publish"
                          else "subscribe"), (found[2] if found else "?")
    if required is None:
        fix = FIX_PERMISSIONS
    else:
        pattern = required.granting(operation, subject) or subject
        fix = (f"grant the sink's user {operation} on {pattern} (nats-server: authorization "
               f"{{ users = [{{ user, password, permissions }}] }}); everything the sink needs: "
               f"{required.describe()}")
    return ConfigurationError(
        f"{SYSTEM}: {what} failed: the server refused the sink's user to {operation} "
        f"{'to' if operation == 'publish' else 'on'} {subject} (a permissions violation, "
        "as nats-py reports it: in lower case).", fix=fix)
