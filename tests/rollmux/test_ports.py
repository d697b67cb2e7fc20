"""`free_port` never hands one port out twice, even when the kernel offers it again."""

from __future__ import annotations

import socket

from rollmux.core.ports import free_port


def test_ports_are_distinct_and_bindable() -> None:
    ports = [free_port() for _ in range(200)]
    assert len(set(ports)) == len(ports)
    with socket.socket() as s:
        s.bind(("127.0.0.1", ports[-1]))  # nothing holds it
