"""The delivery handles of a broker session, by message ID: for an acknowledging source over a
broker that acknowledges by a handle of one delivery (an AMQP delivery tag, a STOMP ``ack``
header, a JMS message object) rather than by the message's stable ID.

The runtime acknowledges by :attr:`~epochal_sdk.Message.id`, the ID that is the same on every
delivery, and it may pass IDs that this session never received (a batch stored by a process
that crashed), or that were acknowledged already (a redelivery of an acknowledged batch,
acknowledged again). A broker that takes handles refuses both, some of them harshly: AMQP
closes the channel on an unknown or already acknowledged delivery tag (a channel error,
``PRECONDITION_FAILED``), and every unacknowledged message of the channel is requeued. So a
source keeps, for each message ID, the handles of its deliveries *in this session*, and
acknowledges each handle once::

    def open(self, max_unacknowledged):
        self.channel = ...                     # a new session
        self.deliveries = DeliveryHandles()    # handles of this session only

    def receive(self, max_messages, timeout):
        ...
        self.deliveries.received(message_id, method.delivery_tag)
        ...

    def acknowledge(self, ids):
        for tag in self.deliveries.take(ids):  # unknown or acknowledged IDs give none
            self.channel.basic_ack(tag)        # never multiple=True: only these messages

    def close(self):
        self.deliveries.forget()               # the session's handles die with it
        ...

An ID delivered twice in one session (a producer that sent it twice, a redelivery after a
consumer-side recover) has two handles; both are acknowledged. An ID this session did not
receive has none: the broker redelivers that message to this session, the runtime drops the
redelivery and acknowledges its ID again, and then it has a handle.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Generic, TypeVar

Handle = TypeVar("Handle")
"""What the broker's client acknowledges a delivery by (an int delivery tag, a string)."""


class DeliveryHandles(Generic[Handle]):
    """The delivery handles of one broker session that are not acknowledged yet, by message
    ID. Not thread-safe: use it from the source's calls (they come one at a time)."""

    def __init__(self) -> None:
        self._handles: dict[str, list[Handle]] = {}

    def received(self, message_id: str, handle: Handle) -> None:
        """Note a delivery of ``message_id`` in this session, acknowledged by ``handle``."""
        self._handles.setdefault(message_id, []).append(handle)

    def take(self, ids: Iterable[str]) -> list[Handle]:
        """The handles to acknowledge for ``ids``, in the order of ``ids`` (and of their
        deliveries), each handed out once: an ID with no delivery in this session (received
        by an earlier session, or whose handles were taken already) gives none."""
        return [handle for message_id in ids for handle in self._handles.pop(message_id, ())]

    def forget(self) -> None:
        """Drop every handle: the session ended (closed or lost), its handles are void, and
        the broker redelivers what they stood for to the next session."""
        self._handles.clear()

    def __len__(self) -> int:
        """How many message IDs have deliveries not acknowledged yet."""
        return len(self._handles)

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._handles
