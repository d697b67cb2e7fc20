from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

import pytest

from rollmux.core.errors import RollMuxError
from rollmux.core.lifecycle import IllegalTransitionError, transition


class Light(str, Enum):
    RED = "red"
    GREEN = "green"
    OFF = "off"


TABLE = {
    Light.RED: frozenset({Light.GREEN, Light.OFF}),  # timer / power cut
    Light.GREEN: frozenset({Light.RED}),  # timer
    Light.OFF: frozenset(),  # terminal
}


@dataclass
class Record:
    state: Light = Light.RED
    history: list = field(default_factory=list)

    def describe(self) -> str:
        return "light 7"


class CustomError(IllegalTransitionError):
    pass


def test_legal_edges_move_and_record_history() -> None:
    r = Record()
    transition(r, TABLE, Light.GREEN, now=1.0, reason="timer")
    transition(r, TABLE, Light.RED, now=2.0, reason="timer")
    assert r.state is Light.RED
    assert r.history == [("red", "green", 1.0, "timer"), ("green", "red", 2.0, "timer")]


@pytest.mark.parametrize(("start", "to"), [(Light.GREEN, Light.OFF), (Light.OFF, Light.RED), (Light.RED, Light.RED)],
                         ids=["not-an-edge", "from-terminal", "self-loop"])
def test_illegal_edges_are_refused_and_leave_the_record_unchanged(start: Light, to: Light) -> None:
    r = Record(state=start)
    with pytest.raises(CustomError, match="light 7: illegal transition") as err:
        transition(r, TABLE, to, now=0.0, reason="x", error=CustomError)
    assert isinstance(err.value, RollMuxError)
    assert r.state is start and r.history == []


def test_history_is_bounded() -> None:
    r = Record()
    for i in range(10):
        transition(r, TABLE, Light.GREEN if r.state is Light.RED else Light.RED, now=float(i), reason="t",
                   history_limit=3)
    assert len(r.history) == 3 and r.history[-1][2] == 9.0
