"""Object keys from a template, and transaction ids read back from keys.

The default, ``{prefix}/batch={batch}/part-{partition}-{txn}.{ext}``, names every object after
its transaction: a retried task (a new attempt id), a replayed batch (a new epoch) or another
query never writes the same key. A template without ``{txn}`` could collide (two attempts of one
partition, two runs of one batch) and is refused when the sink is made. ``{txn}`` (the
transaction id, ``[A-Za-z0-9_.-]``) is also how :meth:`KeyTemplate.parse` finds the transaction
of an open upload that ``ListMultipartUploads`` returns.
"""

from __future__ import annotations

import re
import string

from twophase import TXN_ID_MAX_LENGTH, ConfigurationError, TxnId

DEFAULT_KEY_TEMPLATE = "{prefix}/batch={batch}/part-{partition}-{txn}.{ext}"
FIELDS = ("prefix", "namespace", "batch", "partition", "txn", "ext")
#: Fields known before any transaction exists: the listing prefix may include them.
_STATIC = frozenset({"prefix", "ext"})
_FIELD_PATTERNS = {"namespace": r"[A-Za-z0-9_-]+", "batch": r"\d+", "partition": r"\d+",
                   "txn": rf"[A-Za-z0-9_.-]{{1,{TXN_ID_MAX_LENGTH}}}"}


class KeyTemplate:
    """``template`` with ``prefix`` and ``ext`` filled in; checked when made."""

    def __init__(self, template: str, *, prefix: str, ext: str) -> None:
        self.template = template
        self.prefix = prefix.strip("/")
        self.ext = ext
        parts = list(string.Formatter().parse(template))
        names = [name for _, name, _, _ in parts if name is not None]
        fix = f"use the default key_template={DEFAULT_KEY_TEMPLATE!r}, or keep {{txn}} in yours"
        for _, name, spec, conversion in parts:
            if name is not None and (name not in FIELDS or spec or conversion):
                raise ConfigurationError(
                    f"S3Sink: key_template {template!r} has an unknown field {{{name}}}; "
                    f"known: {', '.join('{' + f + '}' for f in FIELDS)}.", fix=fix)
        if "txn" not in names:
            raise ConfigurationError(
                f"S3Sink: key_template {template!r} has no {{txn}}: two attempts of one "
                "partition, or two runs of one batch, would write the same key, and the sink "
                "could not tell whose object it is.", fix=fix)
        if names.count("txn") > 1:
            raise ConfigurationError(f"S3Sink: key_template {template!r} names {{txn}} twice.",
                                     fix=fix)
        self._parts = parts
        regex, seen = "", set()
        for literal, name, _, _ in parts:
            regex += re.escape(literal)
            if name is None:
                continue
            if name in _STATIC:
                regex += re.escape(self.prefix if name == "prefix" else ext)
            else:
                regex += f"(?P={name})" if name in seen else \
                    f"(?P<{name}>{_FIELD_PATTERNS[name]})"
                seen.add(name)
        self._pattern = re.compile(regex)

    def key(self, txn_id: TxnId) -> str:
        """The object key of a transaction."""
        return self._clean(self.template.format(
            prefix=self.prefix, namespace=txn_id.namespace, batch=txn_id.batch,
            partition=txn_id.partition, txn=str(txn_id), ext=self.ext))

    def listing_prefix(self, namespace: str) -> str:
        """The longest key prefix every transaction of ``namespace`` shares."""
        out = ""
        for literal, name, _, _ in self._parts:
            out += literal
            if name is None:
                continue
            if name == "namespace":
                out += namespace
            elif name in _STATIC:
                out += self.prefix if name == "prefix" else self.ext
            else:
                break
        return self._clean(out)

    def parse(self, key: str) -> TxnId | None:
        """The transaction a key of this template names, or None for any other key."""
        match = self._pattern.fullmatch("/" + key) or self._pattern.fullmatch(key)
        if match is None:
            return None
        try:
            return TxnId.parse(match.group("txn"))
        except (ValueError, ConfigurationError):
            return None

    @staticmethod
    def _clean(key: str) -> str:
        """An empty prefix leaves no leading or doubled slash."""
        return re.sub(r"/{2,}", "/", key).lstrip("/")
