"""The delivery handles of a broker session (``epochal_sdk.delivery``): each handle is handed
out once, an ID with no delivery in the session gives none, and a session's end voids them."""

from __future__ import annotations

from epochal_sdk.delivery import DeliveryHandles


def test_each_handle_is_handed_out_once_in_the_order_of_the_ids() -> None:
    deliveries: DeliveryHandles[int] = DeliveryHandles()
    for tag, message_id in enumerate(["a", "b", "c"], start=1):
        deliveries.received(message_id, tag)
    assert deliveries.take(["c", "a"]) == [3, 1]
    assert deliveries.take(["a", "c"]) == []  # acknowledged already: nothing to send again
    assert deliveries.take(["b"]) == [2]
    assert len(deliveries) == 0


def test_an_id_this_session_did_not_receive_gives_no_handle() -> None:
    deliveries: DeliveryHandles[int] = DeliveryHandles()
    deliveries.received("mine", 7)
    assert deliveries.take(["an earlier session's", "mine"]) == [7]


def test_an_id_delivered_twice_in_a_session_has_both_handles_acknowledged() -> None:
    deliveries: DeliveryHandles[str] = DeliveryHandles()
    deliveries.received("m1", "ack-1")
    deliveries.received("m1", "ack-2")
    assert "m1" in deliveries and len(deliveries) == 1
    assert deliveries.take(["m1", "m1"]) == ["ack-1", "ack-2"]


def test_a_session_s_end_voids_its_handles() -> None:
    deliveries: DeliveryHandles[int] = DeliveryHandles()
    deliveries.received("m1", 1)
    deliveries.forget()
    assert deliveries.take(["m1"]) == []
    deliveries.received("m1", 1)  # the next session's first delivery has tag 1 again
    assert deliveries.take(["m1"]) == [1]
