"""One SASL login of the sink's own: the brokers' answer to a password, which kafka-python loses.

A broker that refuses a SASL login (a wrong or revoked password) answers the last
``SaslAuthenticate`` with SASL_AUTHENTICATION_FAILED and closes the connection at once, both
after ``connection.failed.authentication.delay.ms`` (100 ms by default), so they usually reach
the client in one read. kafka-python 3.0.12 mostly cannot report it:

* its transport (``kafka.net.transport``, ``_read_from_sock``) drops the bytes it read in the
  pass that meets the end of the stream and reports ``KafkaConnectionError('socket
  disconnected')``: the answer is lost (five logins in six, measured on the secured test
  broker);
* when it does read the answer, ``KafkaConnection.initialize`` closes the connection with the
  ``SaslAuthenticationFailedError`` instead of raising it, so the connection manager never
  records it as an authentication failure (``_auth_failures`` stays empty): requests waiting
  on that connection fail with it (naming no user), but a client's bootstrap
  (``KafkaAdminClient`` and ``KafkaConsumer`` make one when they are built) retries every
  failed connection until ``bootstrap_timeout_ms``, then raises ``KafkaTimeoutError('Unable to
  bootstrap from ...')``.

So a refused login mostly looks like a broker that cannot be reached. Where a client fails so,
or says it was refused, :meth:`~sinks.kafka.connection.KafkaSettings.login_checked` asks the
broker itself through :func:`refusal`: one handshake and login on a blocking socket, with the
password the client used, reading each answer before the close. The broker's refusal is then
raised as what it is (a :class:`~twophase.ConfigurationError` naming the user, or a rotated
password read again, :func:`twophase.kit.retried_if_rotated`). Only mechanisms that log in
with a password (:data:`PASSWORD_MECHANISMS`) are asked. It uses kafka-python's protocol
classes (``KafkaProtocol``, ``SaslHandshakeRequest``, ``SaslAuthenticateRequest``) and its SASL
mechanisms (``get_sasl_mechanism``): ``tests/test_rotation.py`` fails if an upgrade moves them.
"""

from __future__ import annotations

import socket
from collections.abc import Mapping
from typing import Any

import kafka.errors as kerrors
from kafka.net.sasl import get_sasl_mechanism
from kafka.protocol.parser import KafkaProtocol
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

#: SASL mechanisms whose login is a user name and a password (``sasl_plain_password``).
PASSWORD_MECHANISMS = frozenset({"PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"})
#: Versions every broker since Kafka 2.0 answers (no ``ApiVersions`` needed before them).
HANDSHAKE_VERSION = 1
AUTHENTICATE_VERSION = 1
RECEIVE_BYTES = 4096


def refusal(sock: socket.socket, host: str,
            configs: Mapping[str, Any]) -> kerrors.SaslAuthenticationFailedError | None:
    """Log in on ``sock`` (connected to the broker ``host``, TLS already made if the clients use
    it) as kafka-python ``configs`` say; the broker's refusal, naming the user, or None if it
    let the user in (or does not offer the mechanism: no matter of the password). A broker
    that closes before it answers raises ``ConnectionError``."""
    protocol = KafkaProtocol(client_id=configs.get("client_id", "twophase"))
    handshake = _answer(sock, protocol, SaslHandshakeRequest(
        mechanism=configs["sasl_mechanism"], version=HANDSHAKE_VERSION))
    if handshake.error_code:
        return None
    mechanism = get_sasl_mechanism(configs["sasl_mechanism"])(host=host, **configs)
    while not mechanism.is_done():
        answer = _answer(sock, protocol, SaslAuthenticateRequest(
            auth_bytes=mechanism.auth_bytes(), version=AUTHENTICATE_VERSION))
        if answer.error_code:
            return kerrors.SaslAuthenticationFailedError(
                f"the brokers refuse the login of user {configs['sasl_plain_username']!r} "
                f"({configs['sasl_mechanism']}): {answer.error_message}")
        mechanism.receive(answer.auth_bytes)
    return None


def _answer(sock: socket.socket, protocol: KafkaProtocol, request: Any) -> Any:
    """Send ``request``; its response, read whole before anything the broker does next."""
    protocol.send_request(request)
    sock.sendall(protocol.send_bytes())
    while True:
        data = sock.recv(RECEIVE_BYTES)
        if not data:
            raise ConnectionError("the broker closed the connection before it answered")
        responses = protocol.receive_bytes(data)
        if responses:
            return responses[0][1]
