"""NATS JetStream, exactly once by a compare-and-set chain the driver publishes:
:class:`JetStreamSink`.

::

    from sinks.nats import JetStreamSink

    sink = JetStreamSink("nats://nats1:4222", stream="ORDERS", subject="orders.live")

One module per role:

==============  ===========================================================================
module          role
==============  ===========================================================================
``sink``        :class:`JetStreamSink`: the phases, what a crash at each leaves, what readers
                see
``committer``   :class:`JetStreamCommitter`: one ordered chain per batch, proofs, abort, the
                listing in doubt, the purge of proofs
``chain``       the compare-and-set chain into the target subject: its tip, the sequential
                and pipelined publishers, where atomic batches would plug in
``staging``     the staging stream the sink owns: staged messages, proofs of commit
``preflight``   what ``check_schema`` refuses: retention and limits that may drop the proof
``subjects``    the names: staging and proof subjects, transaction ids as subject tokens,
                the headers of a committed message
``payload``     rows to payloads: one JSON object, or a column as is
``connection``  settings (credentials by reference, hidden), TLS verified (and required
                before any credential is sent), one connection and event loop per phase
``access``      the permissions the sink's NATS user needs: the one list
``errors``      every NATS error and how it is classified: the one place
==============  ===========================================================================
"""

from sinks.nats.sink import JetStreamSink

__all__ = ["JetStreamSink"]
