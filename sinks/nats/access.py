"""What the sink's NATS user must be allowed, in one place: :func:`permissions`.

The sink publishes to its target subject and to its staging stream's subjects
(``twophase.stage.<stream>.*``, ``twophase.done.<stream>.*``), calls a handful of JetStream
API subjects of its two streams (``$JS.API.STREAM.INFO.<stream>``...), answers the staging
stream's flow control while it reads staged messages back (``$JS.FC.<staging>.>``), and
receives every reply on an inbox (``_INBOX.>``): nothing else. A secured server's user for the
sink is made of exactly this list (``setups.nats``), and a permission the server refuses is
named from it (:func:`~sinks.nats.errors.permission_denied`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sinks.nats.subjects import Layout

#: The JetStream API's subjects (no domain, no custom prefix: the sink uses neither).
API = "$JS.API"
#: Where a push consumer's flow-control requests are answered.
FLOW_CONTROL = "$JS.FC"
#: Where nats-py's replies arrive (its default inbox prefix).
INBOX = "_INBOX.>"
#: NATS subject wildcards: one token, the rest.
ONE_TOKEN, THE_REST = "*", ">"


@dataclass(frozen=True)
class Permissions:
    """The subjects a user may publish to and subscribe to (NATS wildcards allowed)."""

    publish: tuple[str, ...]
    subscribe: tuple[str, ...]

    def describe(self) -> str:
        """As a fix names them: ``publish on a, b; subscribe on c``."""
        return (f"publish on {', '.join(self.publish)}; "
                f"subscribe on {', '.join(self.subscribe)}")

    def as_config(self) -> dict[str, Any]:
        """A nats-server user's ``permissions`` block (as JSON, which its configuration
        reads)."""
        return {"publish": {"allow": list(self.publish)},
                "subscribe": {"allow": list(self.subscribe)}}

    def granting(self, operation: str, subject: str) -> str | None:
        """The pattern of this list that allows ``operation`` (``publish`` or ``subscribe``)
        on ``subject``, compared without case (nats-py reports a refused subject in lower
        case): None if none does."""
        patterns = self.publish if operation == "publish" else self.subscribe
        return next((pattern for pattern in patterns
                     if matches(pattern.lower(), subject.lower())), None)

    def without(self, *patterns: str) -> Permissions:
        """These permissions less ``patterns`` (to make a user lacking one, in tests)."""
        return Permissions(tuple(p for p in self.publish if p not in patterns),
                           tuple(p for p in self.subscribe if p not in patterns))


def permissions(subject: str, layout: Layout) -> Permissions:
    """Exactly what the sink needs to write ``subject`` of ``layout.stream`` through its
    staging stream ``layout.staging_stream``."""
    stream, staging = layout.stream, layout.staging_stream
    return Permissions(
        publish=(
            subject, *layout.staging_subjects,
            f"{API}.STREAM.NAMES",  # which stream captures the subject (the preflight)
            f"{API}.STREAM.INFO.{stream}", f"{API}.STREAM.INFO.{staging}",
            f"{API}.STREAM.MSG.GET.{stream}",  # the subject's last message: the chain's tip
            f"{API}.STREAM.CREATE.{staging}", f"{API}.STREAM.PURGE.{staging}",
            f"{API}.STREAM.MSG.GET.{staging}",  # a proof of commit
            f"{API}.CONSUMER.CREATE.{staging}",  # reading staged messages back
            f"{FLOW_CONTROL}.{staging}.>",
        ),
        subscribe=(INBOX,))


def matches(pattern: str, subject: str) -> bool:
    """Whether the NATS subject ``pattern`` (``*`` one token, a last ``>`` one or more)
    matches the literal ``subject``."""
    wanted, tokens = pattern.split("."), subject.split(".")
    for index, token in enumerate(wanted):
        if token == THE_REST and index == len(wanted) - 1:
            return len(tokens) > index
        if index >= len(tokens) or token not in (ONE_TOKEN, tokens[index]):
            return False
    return len(tokens) == len(wanted)
