"""Redis Streams, exactly once: :class:`RedisStreamSink` (``pip install twophase[redis]``).

================================  ==============================================================
module                            role
================================  ==============================================================
:mod:`~sinks.redis.sink`          the sink: options, preflight, staging (executor side)
:mod:`~sinks.redis.committer`     the driver side: commit, abort, listing in doubt, purge
:mod:`~sinks.redis.scripts`       the commit and abort scripts (Lua, run in the server)
:mod:`~sinks.redis.entries`       rows as stream entries, a chunk per staged entry
:mod:`~sinks.redis.keys`          the sink's keys, in the stream's cluster slot
:mod:`~sinks.redis.durability`    the server settings a durable pre-commit needs
:mod:`~sinks.redis.connection`    settings and the process's client
:mod:`~sinks.redis.errors`        every Redis error classified; the ACL the sink needs
================================  ==============================================================
"""

from sinks.redis.committer import RedisStreamCommitter
from sinks.redis.errors import ACL_COMMANDS, acl_rules
from sinks.redis.sink import DEFAULT_MAX_ROWS_PER_SCRIPT, RedisStreamSink

__all__ = ["ACL_COMMANDS", "DEFAULT_MAX_ROWS_PER_SCRIPT", "RedisStreamCommitter",
           "RedisStreamSink", "acl_rules"]
