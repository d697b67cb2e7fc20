"""The sidecar socket's front door: peer credentials checked per connection, calls bound to it.

gRPC's Python server tells a handler nothing about a Unix-socket peer (``context.peer()`` is just
``"unix:"``), so the sidecar does not let gRPC listen on the public socket. :class:`SocketFront`
listens there instead, reads every connection's ``SO_PEERCRED`` (pid, uid, gid), refuses peers the
:class:`PeerPolicy` does not allow, and relays each accepted connection to the gRPC server on a
private socket (in a 0700 directory), over an upstream socket bound to a fresh random abstract
name. That name is what gRPC reports as the call's peer, so each handler can look up which
connection (and which process) a call came on: rank ids are honoured only on the connection that
attached them, and a process that reaches the private socket some other way has no entry.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import socket
import struct
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass

log = logging.getLogger("rollmux.sidecar")

_UCRED = struct.Struct("3i")  # struct ucred: pid, uid, gid
MAX_CONNECTIONS = 256
"""Live connections the front relays at most; more are refused (a local flood cannot exhaust threads)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Peer:
    """The process at the other end of one accepted connection, as the kernel reported it."""

    conn: str  # connection id: the gRPC peer string of its relayed upstream ("unix-abstract:...")
    pid: int  # in the sidecar's pid namespace; 0 when the peer lives in another one
    uid: int
    gid: int


@dataclass(frozen=True, slots=True, kw_only=True)
class PeerPolicy:
    """Who may talk to the sidecar: its own uid, `uids`, or members of `gids` (primary or supplementary)."""

    uids: frozenset[int] = frozenset()  # extra allowed user ids (the sidecar's own uid is always allowed)
    gids: frozenset[int] = frozenset()  # allowed group ids

    def allows(self, pid: int, uid: int, gid: int) -> bool:
        if uid == os.getuid() or uid in self.uids or gid in self.gids:
            return True
        return bool(self.gids & supplementary_groups(pid))

    def describe(self) -> str:
        parts = [f"uid {os.getuid()} (the sidecar's)"]
        parts += [f"uid {u}" for u in sorted(self.uids)] + [f"group {g}" for g in sorted(self.gids)]
        return ", ".join(parts)


def supplementary_groups(pid: int) -> frozenset[int]:
    """The groups of process `pid` from /proc (empty when it is not visible, e.g. another pid namespace)."""
    if pid <= 0:
        return frozenset()
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("Groups:"):
                    return frozenset(int(g) for g in line.split()[1:])
    except (OSError, ValueError):
        pass
    return frozenset()


def resolve_group(name: str) -> int:
    """A group name or number as a gid (raises ValueError naming it when unknown)."""
    if name.isdigit():
        return int(name)
    import grp

    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise ValueError(f"group {name!r} does not exist on this host: give a group name or a numeric gid") \
            from None


class SocketFront:
    """Accept on `path`, check each peer, relay the allowed ones to the gRPC server at `upstream`.

    Args:
        path: the public socket ranks connect to.
        upstream: the gRPC server's private socket.
        policy: which peers are allowed.
        on_refused: called with (pid, uid, gid) for every refused connection.
    """

    def __init__(self, path: str, upstream: str, policy: PeerPolicy,
                 on_refused: Callable[[int, int, int], None] = lambda pid, uid, gid: None) -> None:
        self.path, self.upstream, self.policy, self.on_refused = path, upstream, policy, on_refused
        self._lock = threading.Lock()
        self._peers: dict[str, Peer] = {}
        self._socks: dict[str, tuple[socket.socket, socket.socket]] = {}
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="rollmux-uds-front", daemon=True)

    def start(self, mode: int = 0o660) -> SocketFront:
        if os.path.exists(self.path):
            os.unlink(self.path)
        self._listener.bind(self.path)
        os.chmod(self.path, mode)
        self._listener.listen(128)
        self._thread.start()
        return self

    def peer(self, grpc_peer: str) -> Peer | None:
        """The peer of a call whose gRPC peer string is `grpc_peer` (None: not through this front)."""
        with self._lock:
            return self._peers.get(grpc_peer)

    def stop(self) -> None:
        self._closed.set()
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)
        self._listener.close()
        with self._lock:
            conns = list(self._socks)
        for conn in conns:
            self._drop(conn)
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    # ------------------------------------------------------------------------------- internals
    def _accept_loop(self) -> None:
        while not self._closed.is_set():
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            try:
                self._admit(client)
            except OSError as exc:
                log.warning("sidecar socket: dropped a connection: %s", exc)
                client.close()

    def _admit(self, client: socket.socket) -> None:
        pid, uid, gid = _UCRED.unpack(client.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, _UCRED.size))
        with self._lock:
            full = len(self._socks) >= MAX_CONNECTIONS
        if full or not self.policy.allows(pid, uid, gid):
            client.close()
            if full:
                log.warning("sidecar socket: refused pid %d: %d connections already open", pid, MAX_CONNECTIONS)
            else:
                log.warning("sidecar socket: refused pid %d uid %d gid %d: allowed are %s (--allow-uid, "
                            "--allow-group)", pid, uid, gid, self.policy.describe())
            self.on_refused(pid, uid, gid)
            return
        up = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        while True:  # a fresh abstract name; binding fails if it is taken, so it cannot be spoofed
            name = f"rollmux-{secrets.token_hex(12)}"
            try:
                up.bind(f"\0{name}")
                break
            except OSError:
                continue
        try:
            up.connect(self.upstream)
        except OSError:
            up.close()
            raise
        conn = f"unix-abstract:{name}"
        with self._lock:
            self._peers[conn] = Peer(conn=conn, pid=pid, uid=uid, gid=gid)
            self._socks[conn] = (client, up)
        for src, dst in ((client, up), (up, client)):
            threading.Thread(target=self._pump, args=(conn, src, dst), name="rollmux-uds-relay", daemon=True).start()

    def _pump(self, conn: str, src: socket.socket, dst: socket.socket) -> None:
        try:
            while True:
                data = src.recv(1 << 16)
                if not data:
                    break
                dst.sendall(data)
        except OSError:
            pass
        self._drop(conn)

    def _drop(self, conn: str) -> None:
        """Forget the connection first (its id must not outlive it), then close both sockets."""
        with self._lock:
            self._peers.pop(conn, None)
            socks = self._socks.pop(conn, None)
        for s in socks or ():
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)
            s.close()


def private_socket_dir() -> str:
    """A fresh 0700 directory for the gRPC server's private socket (short path: sun_path is 107 bytes)."""
    return tempfile.mkdtemp(prefix="rmx-sc-")


__all__ = ["MAX_CONNECTIONS", "Peer", "PeerPolicy", "SocketFront", "private_socket_dir", "resolve_group",
           "supplementary_groups"]
