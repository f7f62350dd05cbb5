"""What the server must keep for a pre-commit to be durable and a proof never lost, checked
before the first batch (:func:`check_durability`, from ``check_schema``).

=====================  ====================================  ==================================
setting                required                              why
=====================  ====================================  ==================================
``appendonly``         ``yes``                               without the AOF a restart loses
                                                             everything since the last
                                                             snapshot: staged batches, commits
                                                             and their proofs
``appendfsync``        ``always``, or ``everysec`` with      ``always`` fsyncs before it
                       ``accept_loss_window_s >= 1``         replies; ``everysec`` may lose
                       (``no``: ``>= 30``)                   the last second of acknowledged
                                                             writes on an OS crash: a staged
                                                             batch lost then is a loud
                                                             TransactionLostError at commit
``maxmemory-policy``   ``noeviction`` or ``volatile-*``      an ``allkeys-*`` policy may evict
                       (the sink sets no TTL)                a proof (a re-commit would then
                                                             add the batch twice) or a staged
                                                             batch
=====================  ====================================  ==================================

``appendfsync`` is read by ``CONFIG GET`` (``INFO`` does not show it; the least-privileged
user is granted ``+config|get``). Managed services refuse ``CONFIG`` (ElastiCache, Aiven) or
run the AOF every second (Memorystore, Azure): there, ``accept_loss_window_s`` names the loss
window the user accepts, and the AOF and the eviction policy are read from ``INFO``. On a
cluster every primary is checked.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import redis
import redis.exceptions as rexc
from redis.cluster import RedisCluster

from sinks.redis.connection import Client
from sinks.redis.errors import refused

log = logging.getLogger(__name__)

#: What ``appendfsync`` may lose of acknowledged writes on an OS crash (seconds; ``no`` leaves
#: it to the kernel's writeback, 30 s on Linux by default).
LOSS_WINDOW_S: Mapping[str, float] = {"always": 0.0, "everysec": 1.0, "no": 30.0}
SAFE_POLICIES = ("noeviction", "volatile-")


def nodes_of(client: Client) -> list[redis.Redis]:
    """The client itself, or a cluster's primaries one by one."""
    if isinstance(client, RedisCluster):
        primaries = client.get_primaries()  # type: ignore[no-untyped-call]
        return [client.get_redis_connection(node) for node in primaries]
    return [client]


def check_durability(client: Client, accept_loss_window_s: float | None, where: str) -> None:
    """Refuse a server that could lose a proof or a staged batch unannounced (module
    docstring), naming the setting and the fix."""
    for node in nodes_of(client):
        _check_node(node, accept_loss_window_s, where)


def _check_node(node: redis.Redis, accept_loss_window_s: float | None, where: str) -> None:
    persistence: dict[str, Any] = node.info("persistence")
    memory: dict[str, Any] = node.info("memory")
    policy = str(memory.get("maxmemory_policy", "noeviction"))
    if not policy.startswith(SAFE_POLICIES):
        raise refused(
            f"{where}: maxmemory-policy is {policy!r}, which may evict the proof of a commit "
            "(a recovery would then add its batch again) or a staged batch.",
            "CONFIG SET maxmemory-policy noeviction (and in redis.conf), or volatile-lru: the "
            "sink sets no TTL on its keys")
    if int(persistence.get("aof_enabled", 0)) != 1:
        raise refused(
            f"{where}: the AOF is off (appendonly no): a restart loses every staged batch "
            "and every commit since the last snapshot.",
            "CONFIG SET appendonly yes and appendfsync always (and in redis.conf)")
    fsync = _appendfsync(node)
    if fsync is None:
        if accept_loss_window_s is None:
            raise refused(
                f"{where}: CONFIG GET appendfsync is refused, so the sink cannot tell whether "
                "an acknowledged write survives an OS crash.",
                "grant the sink's user +config|get, or, on a managed service that refuses "
                "CONFIG, pass accept_loss_window_s= the window its AOF may lose (1 for "
                "every second)")
        log.warning("%s: appendfsync cannot be read; trusting accept_loss_window_s=%s", where,
                    accept_loss_window_s)
        return
    window = LOSS_WINDOW_S.get(fsync, LOSS_WINDOW_S["no"])
    if window > (accept_loss_window_s or 0.0):
        raise refused(
            f"{where}: appendfsync is {fsync!r}, which may lose the last {window:.0f}s of "
            "acknowledged writes on an OS crash (a staged batch then cannot be committed).",
            f"CONFIG SET appendfsync always (and in redis.conf), or accept that window: "
            f"accept_loss_window_s={window:.0f}")


def _appendfsync(node: redis.Redis) -> str | None:
    """The server's ``appendfsync``, or None where ``CONFIG`` is refused."""
    try:
        config = node.config_get("appendfsync")
    except (rexc.NoPermissionError, rexc.ResponseError) as exc:
        log.info("CONFIG GET appendfsync refused: %s", exc)
        return None
    value = config.get("appendfsync")
    return None if value is None else str(value)
