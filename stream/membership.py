"""Static group membership (KIP-345): how a worker keeps its partitions through a restart.

A worker with a ``group.instance.id`` is a *static* member of its consumer group. When it is killed and started
again with the same id, the group coordinator hands the new process the old one's partitions at once, without a
rebalance and without waiting for the session timeout, so its services are decided again as soon as it has
started. A static member that stops for good must leave explicitly: the consumer does not send ``LeaveGroup`` for
it (the coordinator would otherwise wait out the session timeout before moving its partitions). aiokafka only
speaks ``LeaveGroup`` v0-v1, which name a member id; :func:`leave_group` sends v3, which names the instance id, as
Kafka's ``Admin.removeMembersFromConsumerGroup`` does.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from aiokafka.client import AIOKafkaClient, CoordinationType
from aiokafka.errors import KafkaError, for_code
from aiokafka.protocol.api import Request, RequestStruct, Response
from aiokafka.protocol.types import Array, Int16, Int32, Schema, String

log = logging.getLogger("picrl.worker")

UNKNOWN_MEMBER_ID = ""  # a member named by its instance id only


class _LeaveGroupResponse_v3(Response):
    API_KEY = 13
    API_VERSION = 3
    SCHEMA = Schema(
        ("throttle_time_ms", Int32),
        ("error_code", Int16),
        (
            "members",
            Array(("member_id", String("utf-8")), ("group_instance_id", String("utf-8")), ("error_code", Int16)),
        ),
    )


class _LeaveGroupRequest_v3(RequestStruct):
    API_KEY = 13
    API_VERSION = 3
    RESPONSE_TYPE = _LeaveGroupResponse_v3
    SCHEMA = Schema(
        ("group_id", String("utf-8")),
        ("members", Array(("member_id", String("utf-8")), ("group_instance_id", String("utf-8")))),
    )


class StaticLeaveGroup(Request[_LeaveGroupRequest_v3]):
    """``LeaveGroup`` v3 for one static member, named by its ``group.instance.id``."""

    API_KEY = 13

    def __init__(self, group: str, instance_id: str) -> None:
        self.group = group
        self.instance_id = instance_id

    def build(self, request_struct_class: type[_LeaveGroupRequest_v3]) -> _LeaveGroupRequest_v3:
        return request_struct_class(self.group, [(UNKNOWN_MEMBER_ID, self.instance_id)])


async def leave_group(bootstrap: str, group: str, member: str) -> None:
    """Remove the static member ``member`` from ``group`` now, so that the others take its partitions over at
    their next heartbeat. Best effort, as the consumer's own leave is: a failure is logged, the session timeout
    then moves the partitions."""
    client = AIOKafkaClient(bootstrap_servers=bootstrap, client_id=f"{group}-leave")
    try:
        await client.bootstrap()
        coordinator = await client.coordinator_lookup(CoordinationType.GROUP, group)
        response = await client.send(coordinator, StaticLeaveGroup(group, member))
        errors = [for_code(code) for code in (response.error_code, *(m[2] for m in response.members)) if code]
        if errors:
            raise errors[0]()
        log.info("left group %s as static member %s: its partitions move to the other workers now", group, member)
    except (KafkaError, OSError) as exc:
        log.warning(
            "could not leave group %s as static member %s (%s: %s): its partitions move after the session timeout",
            group,
            member,
            type(exc).__name__,
            exc,
        )
    finally:
        await client.close()


class GroupLog:
    """Says when the worker has joined its consumer group ``group`` (as static member ``instance_id``, if any) and
    which usage partitions (``assigned()``) it got, and after each later rebalance which it holds."""

    def __init__(self, group: str, instance_id: str | None, assigned: Callable[[], set[int]]) -> None:
        self.group, self.instance_id, self.assigned = group, instance_id, assigned
        self.joined = False

    async def on_rebalance_complete(self, *_: object, **__: object) -> None:
        """Connected to the app's ``on_rebalance_complete``."""
        partitions = sorted(self.assigned())
        if self.joined:
            log.info("group %s rebalanced: usage partitions %s", self.group, partitions)
            return
        self.joined = True
        member = "" if self.instance_id is None else f" as static member {self.instance_id}"
        log.info("joined group %s%s: usage partitions %s", self.group, member, partitions)
