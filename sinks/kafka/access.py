"""The ACLs the sink's principal needs on a cluster with an authorizer, and no more.

Found by experiment on Apache Kafka 4.1.1 with the ``StandardAuthorizer``
(``tests/test_kafka_security.py`` checks that each one is needed, and the crash test of
``tests/test_kafka_crash.py`` runs with exactly these):

=================  ==============================  ==================  =========================
resource           name (pattern)                  operations          needed by
=================  ==============================  ==================  =========================
Topic              the target topic (literal)      WRITE               the executors' records
                                                                       (AddPartitionsToTxn,
                                                                       Produce); ``check_schema``
                                                                       (the topic is listed)
Topic              the registry topic (literal)    READ, WRITE         each transaction's first
                                                                       record; recovery and the
                                                                       pool read it
TransactionalId    ``transactional_id_prefix``     WRITE               FindCoordinator,
                   (prefixed)                                          InitProducerId, EndTxn,
                                                                       List/DescribeTransactions
Cluster            ``kafka-cluster``               DESCRIBE_CONFIGS    ``check_schema`` reads the
                                                                       brokers' ``transaction.
                                                                       max.timeout.ms``
Topic              the target topic (literal),     DESCRIBE_CONFIGS    ``check_schema`` reads its
                   ``mode="keyed"`` only                               ``cleanup.policy``
                                                                       (:mod:`~sinks.kafka.
                                                                       changelog`)
=================  ==============================  ==================  =========================

DESCRIBE need not be granted: Kafka implies it from READ and WRITE (a principal without it
is told TOPIC_AUTHORIZATION_FAILED for a topic whether it exists or not). CREATE on the
registry topic (literal) is needed only if the sink is to create it (else create it
beforehand: one partition, ``cleanup.policy=compact``). A transactional producer needs no
IDEMPOTENT_WRITE on the cluster: WRITE on its transactional id covers it.

``python -m twophase.cleanup`` needs READ on the registry topic and WRITE on the ids
(:func:`cleanup_grants`: it lists, describes and ends transactions); ``python -m
twophase.status --sink ...`` only READ on the registry topic and DESCRIBE on the ids
(:func:`status_grants`).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from kafka.admin import (
    ACL,
    ACLOperation,
    ACLPermissionType,
    ACLResourcePatternType,
    ResourcePattern,
    ResourceType,
)

#: The one resource name of the cluster in ACLs.
CLUSTER_NAME = "kafka-cluster"
#: What each resource needs, in the order of the table above.
TOPIC_OPERATIONS = (ACLOperation.WRITE,)
REGISTRY_OPERATIONS = (ACLOperation.READ, ACLOperation.WRITE)
TRANSACTIONAL_ID_OPERATIONS = (ACLOperation.WRITE,)
CLUSTER_OPERATIONS = (ACLOperation.DESCRIBE_CONFIGS,)
#: What the keyed mode needs on its topic besides :data:`TOPIC_OPERATIONS`.
KEYED_TOPIC_OPERATIONS = (ACLOperation.DESCRIBE_CONFIGS,)


@dataclass(frozen=True)
class Grant:
    """One ACL the sink's principal needs: ``operation`` on a resource (allowed, any host)."""

    resource: ResourceType
    name: str
    operation: ACLOperation
    pattern: ACLResourcePatternType = ACLResourcePatternType.LITERAL

    def acl(self, principal: str) -> ACL:
        """As kafka-python's admin client creates it (``principal`` like ``User:etl``)."""
        return ACL(principal, "*", self.operation, ACLPermissionType.ALLOW,
                   ResourcePattern(self.resource, self.name, self.pattern))

    def command(self, principal: str) -> str:
        """As ``kafka-acls.sh --add`` arguments."""
        resource = {ResourceType.TOPIC: f"--topic {self.name}",
                    ResourceType.TRANSACTIONAL_ID: f"--transactional-id {self.name}",
                    ResourceType.CLUSTER: "--cluster"}[self.resource]
        pattern = ("" if self.pattern == ACLResourcePatternType.LITERAL
                   else f" --resource-pattern-type {self.pattern.name.lower()}")
        operation = "".join(word.title() for word in self.operation.name.split("_"))
        return (f"--add --allow-principal {principal} --operation {operation} {resource}"
                f"{pattern}")


def grants(topics: Iterable[str], transactional_id_prefix: str, registry_topic: str, *,
           create_registry: bool = False, keyed: bool = False) -> list[Grant]:
    """Every ACL a sink writing ``topics`` needs (see the module docstring; ``keyed``: in
    ``mode="keyed"``)."""
    operations = TOPIC_OPERATIONS + (KEYED_TOPIC_OPERATIONS if keyed else ())
    needed = [Grant(ResourceType.TOPIC, topic, operation)
              for topic in topics for operation in operations]
    needed += [Grant(ResourceType.TOPIC, registry_topic, operation)
               for operation in REGISTRY_OPERATIONS]
    if create_registry:
        needed.append(Grant(ResourceType.TOPIC, registry_topic, ACLOperation.CREATE))
    needed += [_ids(transactional_id_prefix, operation)
               for operation in TRANSACTIONAL_ID_OPERATIONS]
    needed += [Grant(ResourceType.CLUSTER, CLUSTER_NAME, operation)
               for operation in CLUSTER_OPERATIONS]
    return needed


def cleanup_grants(transactional_id_prefix: str, registry_topic: str) -> list[Grant]:
    """What ``python -m twophase.cleanup`` needs: list, describe, commit and abort."""
    return [Grant(ResourceType.TOPIC, registry_topic, ACLOperation.READ),
            _ids(transactional_id_prefix, ACLOperation.WRITE)]


def status_grants(transactional_id_prefix: str, registry_topic: str) -> list[Grant]:
    """What ``python -m twophase.status --sink ...`` needs: list and describe only."""
    return [Grant(ResourceType.TOPIC, registry_topic, ACLOperation.READ),
            _ids(transactional_id_prefix, ACLOperation.DESCRIBE)]


def _ids(prefix: str, operation: ACLOperation) -> Grant:
    return Grant(ResourceType.TRANSACTIONAL_ID, prefix, operation,
                 ACLResourcePatternType.PREFIXED)
