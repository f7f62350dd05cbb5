"""Apache Kafka, exactly once by transactions the driver commits: :class:`KafkaSink`.

::

    from sinks.kafka import KafkaSink

    sink = KafkaSink("broker1:9092,broker2:9092", "orders_live", key="order_id")

Consumers of the topic must read with ``isolation.level=read_committed``. One module per role:

==============  ===========================================================================
module          role
==============  ===========================================================================
``sink``        :class:`KafkaSink`: the phases, and what a crash at each one leaves
``committer``   :class:`KafkaCommitter`: EndTxn commit/abort from any process, proven by
                the coordinator's description of the transactional id
``lookups``     what the brokers know of transactional ids (list, describe): executors
                ask before taking an id, the driver and cleanup to find what is in doubt
``pool``        the bounded pool of transactional ids, and which one an attempt may take
``registry``    the compacted topic naming the twophase transaction of each producer epoch
``producer``    the executors' librdkafka transactional producer (never ``close()``: it aborts)
``records``     rows to records: topic, key, value (JSON by default), headers
``arrow``       Arrow record batches to the same records, column-wise (no Python per row)
``changelog``   ``mode="keyed"``: the newest change per key, its version in a header, deletes
                as tombstones, on a topic whose ``cleanup.policy`` includes ``compact``
``adapter``     every use of kafka-python's private parts (and nothing else)
``errors``      every Kafka error and how it is classified: the one place
``connection``  settings (passwords by reference, hidden), TLS verified first, one admin
                client per process
``access``      the ACLs the sink's principal needs (and cleanup's, status's), nothing more
==============  ===========================================================================
"""

from sinks.kafka.sink import KafkaSink

__all__ = ["KafkaSink"]
