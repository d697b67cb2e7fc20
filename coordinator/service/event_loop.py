"""Which event loop the coordinator runs on.

The coordinator is one event loop, so its grant latency is that loop's wake-up and scheduling
cost besides its work. At 2,000 jobs uvloop (libuv) had 4-51 grants over 10 ms a minute where
asyncio had 26-1,153, for the same CPU per cycle (docs/design/decisions.md), so it is
the default wherever it is installed (a dependency of rollmux on Linux and macOS); asyncio stays
selectable and is the fallback.
"""

from __future__ import annotations

import asyncio
import enum
import importlib.util
from collections.abc import Coroutine
from typing import Any


class EventLoop(enum.Enum):
    AUTO = "auto"  # uvloop where installed, asyncio otherwise
    UVLOOP = "uvloop"
    ASYNCIO = "asyncio"


class EventLoopUnavailable(RuntimeError):
    """An event loop was asked for by name and is not installed."""


def uvloop_installed() -> bool:
    return importlib.util.find_spec("uvloop") is not None


def resolve(choice: EventLoop | str) -> EventLoop:
    """The concrete loop for `choice`: AUTO becomes UVLOOP or ASYNCIO; UVLOOP without uvloop raises."""
    choice = EventLoop(choice)
    if choice is EventLoop.AUTO:
        return EventLoop.UVLOOP if uvloop_installed() else EventLoop.ASYNCIO
    if choice is EventLoop.UVLOOP and not uvloop_installed():
        raise EventLoopUnavailable("event loop uvloop: uvloop is not installed (pip install uvloop; "
                                   "a dependency of rollmux except on Windows)")
    return choice


def new_event_loop(choice: EventLoop | str) -> asyncio.AbstractEventLoop:
    """A fresh loop of the resolved kind (for a loop run in a thread of its own)."""
    if resolve(choice) is EventLoop.UVLOOP:
        import uvloop

        return uvloop.new_event_loop()
    return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, object], choice: EventLoop | str) -> object:
    """`asyncio.run(main)` on a loop of the resolved kind."""
    with asyncio.Runner(loop_factory=lambda: new_event_loop(choice)) as runner:
        return runner.run(main)
