"""Local TCP ports for child processes that this process starts (demo, chaos, tests, benchmarks).

Binding port 0 and letting it go is the usual trick, but the kernel may hand the same port out
again to the next bind(0) while the first owner has not yet started: the chaos deployment once gave
its redis-server and its first coordinator one port, so the coordinator never ran and every
"failover" restarted the same instance. `free_port` remembers what it gave out in this process and
never returns a port twice.
"""

from __future__ import annotations

import socket
import threading

_given: set[int] = set()
_lock = threading.Lock()


def free_port(host: str = "127.0.0.1", *, tries: int = 64) -> int:
    """A port on `host` that nothing listens on now and that this process has not handed out before."""
    with _lock:
        for _ in range(tries):
            with socket.socket() as s:
                s.bind((host, 0))
                port = int(s.getsockname()[1])
            if port not in _given:
                _given.add(port)
                return port
    raise OSError(f"no fresh port on {host} after {tries} tries ({len(_given)} handed out)")
