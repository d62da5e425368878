"""The app's inbox: updates from an engine thread reach the app's thread in order, in batches,
with one wake-up per batch and an immediate one for an output's last update."""

from __future__ import annotations

import threading

from helpers import done, event

from chatpage.ui.messages import Inbox


def test_one_wake_up_per_batch_and_an_urgent_one_for_a_last_update():
    wakes = []
    inbox = Inbox(wakes.append)
    for text in "abc":
        inbox.put(event("r1", text))
    assert wakes == [False]  # the app takes these a little later, all at once
    inbox.put(done("r1", "d"))
    assert wakes == [False, True]
    assert [u.outputs[0].text for u in inbox.take()] == ["a", "b", "c", "d"]
    assert inbox.take() == []
    inbox.put(event("r2", "x"))  # after a take, the next update wakes the app again
    assert wakes == [False, True, False]


def test_updates_put_while_the_app_takes_are_neither_lost_nor_left_without_a_wake_up():
    pending = threading.Semaphore(0)  # one release per wake-up, as the app's queue would hold
    inbox = Inbox(lambda urgent: pending.release())
    total = 20000

    def engine():
        for i in range(total):
            inbox.put(event("r1", "x" * (i + 1)))

    thread = threading.Thread(target=engine)
    thread.start()
    seen: list[int] = []
    while len(seen) < total:
        assert pending.acquire(timeout=10), "updates wait in the inbox with no wake-up"
        seen.extend(u.outputs[0].num_tokens for u in inbox.take())
    thread.join()
    assert seen == list(range(1, total + 1))
