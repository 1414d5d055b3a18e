"""n choices of one request at the HTTP layer (control/api/generation.py): their events in
index order when several are ready at once, and one client disconnect seen by every
choice, whichever finished first. (test_n_choices.py serves n > 1 end to end.)"""

from __future__ import annotations

import asyncio

from control.api.generation import SharedReceive, merged_events
from control.serve.streams import StreamEvent


class ReadyChoice:
    """A choice whose next event is always ready: one token, then its finish."""

    def __init__(self, index: int):
        self.events = [StreamEvent(f"r-{index}", "x", (index,), 1),
                       StreamEvent(f"r-{index}", "", (), 1, finished=True)]

    async def next_event(self) -> StreamEvent:
        return self.events.pop(0)


def test_choices_ready_together_come_out_in_index_order():
    """A client builds choices[i] from the events' index: those of one wake-up go out
    0, 1, 2, ... (here all eight are ready at once, twice), not in the order a set of
    finished tasks happens to hold them."""
    async def scenario():
        return [index async for index, _ in merged_events([ReadyChoice(i) for i in range(8)])]

    assert asyncio.run(scenario()) == list(range(8)) * 2


def test_a_choice_that_stops_watching_leaves_the_disconnect_to_the_others():
    """Each choice watches the client through one SharedReceive; the first to finish
    stops watching (its watcher is cancelled), and the others must still see the client
    leave, or their requests decode on for nobody."""
    async def scenario():
        messages: asyncio.Queue = asyncio.Queue()
        shared = SharedReceive(messages.get)
        first, second = (asyncio.ensure_future(shared()) for _ in range(2))
        await asyncio.sleep(0)
        first.cancel()
        await asyncio.sleep(0)
        messages.put_nowait({"type": "http.disconnect"})
        message = await asyncio.wait_for(second, 5)
        shared.close()
        return first.cancelled(), message

    first_cancelled, message = asyncio.run(scenario())
    assert first_cancelled and message == {"type": "http.disconnect"}
