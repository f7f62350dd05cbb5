"""What the driver checks before anything is written (``check_schema``): the target stream
keeps the proof a recovery reads, and the staging stream exists.

The subject's last message is where a crashed commit resumes (:mod:`~sinks.nats.chain`), so it
must outlive the longest time a decided batch may wait for its commit, the **recovery
horizon** (``recovery_horizon_s``, 7 days by default: a driver down over a long weekend).
Refused, each naming the setting and the fix:

* ``retention`` WorkQueue or Interest: a message is deleted once consumed (or acknowledged by
  every consumer), the tip with it;
* ``max_age`` shorter than the horizon: the tip expires before a late recovery reads it;
* a count limit (``max_msgs``, ``max_bytes``, ``max_msgs_per_subject``) that discards old
  messages: it evicts by volume, not by age, so nothing bounds how soon the tip (or the first
  rows of a batch, before any reader) goes.

The duplicate window plays no part (the chain's compare-and-set does not depend on it).
"""

from __future__ import annotations

from nats.js import api
from nats.js.errors import NotFoundError

from sinks.nats import staging
from sinks.nats.chain import Target
from sinks.nats.connection import Connection
from sinks.nats.errors import FIX_STREAM, SYSTEM
from sinks.nats.subjects import Layout
from twophase import ConfigurationError

#: How long a decided batch may wait for its commit (and the tip must last), by default.
DEFAULT_RECOVERY_HORIZON_S = 7 * 24 * 3600.0
#: The limits of a stream that evict messages by volume.
COUNT_LIMITS = ("max_msgs", "max_bytes", "max_msgs_per_subject")
#: ``nats stream edit`` flags of those limits.
_FLAGS = {"max_msgs": "--max-msgs=-1", "max_bytes": "--max-bytes=-1",
          "max_msgs_per_subject": "--max-msgs-per-subject=-1"}


async def check(connection: Connection, target: Target, layout: Layout,
                horizon_s: float) -> None:
    """The target stream exists, captures the subject and keeps its tip for the horizon; the
    staging stream exists (created if not)."""
    try:
        info = await connection.js.stream_info(target.stream)
        capturing = await connection.js.find_stream_name_by_subject(target.subject)
    except NotFoundError:
        info, capturing = None, None
    if info is None or capturing != target.stream:
        raise ConfigurationError(
            f"{SYSTEM}: no stream {target.stream} capturing subject {target.subject} "
            f"(the subject is captured by {capturing or 'no stream'}).", fix=FIX_STREAM)
    check_retention(target.stream, info.config, horizon_s)
    await staging.ensure_stream(connection, layout)


def check_retention(stream: str, config: api.StreamConfig, horizon_s: float) -> None:
    """Refuse a stream that may drop its subject's last message within ``horizon_s``."""
    retention = api.RetentionPolicy(config.retention or api.RetentionPolicy.LIMITS)
    if retention != api.RetentionPolicy.LIMITS:
        raise ConfigurationError(
            f"{SYSTEM}: stream {stream} has retention={retention.value}: it deletes a message "
            "once it is consumed (workqueue) or acknowledged by every consumer (interest), and "
            "with it the subject's last message, which a commit resumed after a crash reads "
            "to publish nothing twice.",
            fix=f"write into a stream with retention=limits (nats stream add {stream} "
                "--retention limits ...); readers keep their own consumers on it")
    max_age = config.max_age or 0.0
    if 0 < max_age < horizon_s:
        raise ConfigurationError(
            f"{SYSTEM}: stream {stream} has max_age={max_age:.0f}s, shorter than the recovery "
            f"horizon recovery_horizon_s={horizon_s:.0f}s: the subject's last message, which a "
            "commit resumed after a crash reads, may expire before a late recovery.",
            fix=f"raise the stream's max_age to at least {horizon_s:.0f}s (nats stream edit "
                f"{stream} --max-age {horizon_s:.0f}s), or pass recovery_horizon_s= the "
                "longest a decided batch may wait for its commit, at most max_age")
    discard = api.DiscardPolicy(config.discard or api.DiscardPolicy.OLD)
    for name in COUNT_LIMITS:
        limit = getattr(config, name) or -1
        if limit > 0 and discard != api.DiscardPolicy.NEW:
            raise ConfigurationError(
                f"{SYSTEM}: stream {stream} has {name}={limit} (discard old): it evicts "
                "messages by volume, not by age, so nothing bounds how soon it drops the "
                "subject's last message, which a commit resumed after a crash reads (or the "
                "first rows of a batch, before any reader sees them).",
                fix=f"remove the limit (nats stream edit {stream} {_FLAGS[name]}) and bound the "
                    "stream by max_age, at least recovery_horizon_s")
