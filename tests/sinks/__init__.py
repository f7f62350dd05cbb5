"""Sink tier: one room per prebuilt sink (``sinks/<name>/``), and here the tests of several."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any
from urllib.parse import quote

#: The separate options a connection URL holds (with the password and the CA bundle).
URL_PARTS = ("host", "port", "user", "database", "tls")


def as_connection_url(scheme: str, options: Mapping[str, Any]) -> tuple[str, dict[str, Any]]:
    """A database sink's separate connection options as one URL of ``scheme`` (user and
    password percent-encoded, TLS in its query), and the options left beside it."""
    left = dict(options)
    password = left.pop("password")
    where = {name: left.pop(name) for name in URL_PARTS}
    query = f"tls={where['tls']}" + (f"&ca_bundle={quote(left.pop('ca_bundle'))}"
                                     if "ca_bundle" in left else "")
    url = (f"{scheme}://{quote(where['user'], safe='')}:{quote(password, safe='')}"
           f"@{where['host']}:{where['port']}/{where['database']}?{query}")
    return url, left


def as_connection_json(options: Mapping[str, Any], names: Iterable[str]
                       ) -> tuple[str, dict[str, Any]]:
    """A sink's separate connection options (those of ``names``: the sink's
    ``CONNECTION_OPTIONS``) as the JSON object ``connection=Secret(...)`` holds, and the
    options left beside it."""
    left = dict(options)
    held = {name: left.pop(name) for name in names if name in left}
    return json.dumps(held), left
