"""`RedisStore`: the coordinator's records in one Redis hash, written by Lua scripts.

Layout (``ns`` defaults to ``rollmux``):
- ``{ns}:state``  hash, field = record key (``job/a``, ``permit/a``, ...), value = JSON text;
- ``{ns}:fence``  integer, the latest leader fence (only ever incremented);
- ``{ns}:leader`` ``"<owner> <fence>"`` with a TTL: the leadership lease.

Each commit is one Lua script: it checks the fence and applies every set and delete of the batch,
so Redis never holds half a transition, and a deposed leader's writes are refused.

Commits (the hot path: one per group-committed batch of transitions) go over a dedicated
connection driven by a minimal `asyncio.Protocol`: the EVALSHA is encoded by hand, written with one
send, and its one-line reply resolves the batch's future straight from `data_received`, so a commit
costs no task, no stream reader and no client-library layers. Loading, leadership and everything
else use redis-py. TLS URLs (``rediss://``) commit through redis-py as well.
"""

from __future__ import annotations

import asyncio
import hashlib
from collections import deque
from collections.abc import Mapping

import redis.asyncio as aioredis
from redis.asyncio.connection import Connection, UnixDomainSocketConnection
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rollmux.coordinator.service.runtime.api import StaleFenceError, StoreError, StoreUnavailableError

STALE_FENCE = "STALE_FENCE"
"""The error reply's prefix by which the commit script refuses a stale fencing token (the one thing a
Redis script can answer with besides data; the client maps it to `StaleFenceError`)."""

_COMMIT = f"""
local cur = redis.call('GET', KEYS[2])
if cur ~= ARGV[1] then
  return redis.error_reply('{STALE_FENCE} current=' .. tostring(cur) .. ' got=' .. ARGV[1])
end
local n = tonumber(ARGV[2])
for j = 0, n - 1 do
  redis.call('HSET', KEYS[1], ARGV[3 + 2 * j], ARGV[4 + 2 * j])
end
for j = 3 + 2 * n, #ARGV do
  redis.call('HDEL', KEYS[1], ARGV[j])
end
return 1
"""

_ACQUIRE = """
local cur = redis.call('GET', KEYS[1])
if cur then
  local owner = string.match(cur, '^(.*) %d+$')
  if owner ~= ARGV[1] then return 0 end
end
local f = redis.call('INCR', KEYS[2])
redis.call('SET', KEYS[1], ARGV[1] .. ' ' .. f, 'PX', ARGV[2])
return f
"""

_RENEW = """
local f = redis.call('GET', KEYS[2])
if f ~= ARGV[2] then return 0 end
local cur = redis.call('GET', KEYS[1])
local mine = ARGV[1] .. ' ' .. ARGV[2]
if cur and cur ~= mine then return 0 end
redis.call('SET', KEYS[1], mine, 'PX', ARGV[3])
return 1
"""


def _resp(args: list[str | bytes]) -> bytes:
    """One command in the Redis protocol (RESP2 array of bulk strings)."""
    out = [b"*%d\r\n" % len(args)]
    for a in args:
        b = a if isinstance(a, bytes) else a.encode()
        out.append(b"$%d\r\n" % len(b))
        out.append(b)
        out.append(b"\r\n")
    return b"".join(out)


class _CommitConnection(asyncio.Protocol):
    """A Redis connection for commands whose replies are one line (``+``, ``-`` or ``:``).

    Replies arrive in command order; each resolves the oldest pending future. A reply of any other
    type, a lost connection or a reply overdue by `timeout_s` fails every pending command with
    `StoreUnavailableError` and closes the connection (the next commit opens a new one).
    """

    def __init__(self, url: str, timeout_s: float) -> None:
        self._url = url
        self._timeout_s = timeout_s
        self._loop = asyncio.get_running_loop()
        self._transport: asyncio.Transport | None = None
        self._pending: deque[tuple[asyncio.Future[bytes], float]] = deque()
        self._buf = b""
        self._watchdog: asyncio.TimerHandle | None = None
        self.closed = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def send(self, command: bytes) -> asyncio.Future[bytes]:
        """Write one encoded command; the future gets its reply line (without the CRLF)."""
        fut: asyncio.Future[bytes] = self._loop.create_future()
        if self.closed or self._transport is None:
            fut.set_exception(StoreUnavailableError(f"redis at {self._url} is unreachable: connection closed"))
            return fut
        self._pending.append((fut, self._loop.time()))
        self._transport.write(command)
        if self._watchdog is None:
            self._watchdog = self._loop.call_later(self._timeout_s, self._watch)
        return fut

    def _watch(self) -> None:
        self._watchdog = None
        if not self._pending:
            return
        overdue = self._pending[0][1] + self._timeout_s - self._loop.time()
        if overdue <= 0:
            self._fail(StoreUnavailableError(f"redis at {self._url} did not answer within {self._timeout_s:g}s"))
        else:
            self._watchdog = self._loop.call_later(overdue, self._watch)

    def data_received(self, data: bytes) -> None:
        buf = self._buf + data if self._buf else data
        start = 0
        while True:
            end = buf.find(b"\r\n", start)
            if end < 0:
                break
            line = buf[start:end]
            start = end + 2
            if not self._pending or line[:1] not in (b":", b"+", b"-"):
                self._fail(StoreUnavailableError(f"redis at {self._url} sent an unexpected reply {line[:80]!r}"))
                return
            fut, _ = self._pending.popleft()
            if fut.done():
                continue
            if line[:1] == b"-":
                msg = line[1:].decode(errors="replace")
                if msg.startswith("NOSCRIPT"):  # script cache flushed: reconnect, which loads it again
                    fut.set_exception(StoreUnavailableError(f"redis at {self._url} lost the commit script: {msg}"))
                    self._fail(StoreUnavailableError(f"redis at {self._url} lost the commit script"))
                    return
                if STALE_FENCE in msg:
                    fut.set_exception(StaleFenceError(f"commit refused by redis: {msg}; another coordinator took over"))
                else:
                    fut.set_exception(StoreError(f"redis at {self._url} refused a command: {msg}"))
            else:
                fut.set_result(line)
        self._buf = buf[start:]

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail(StoreUnavailableError(f"redis at {self._url} is unreachable: connection lost ({exc})"))

    def _fail(self, error: Exception) -> None:
        self.closed = True
        if self._watchdog is not None:
            self._watchdog.cancel()
            self._watchdog = None
        while self._pending:
            fut, _ = self._pending.popleft()
            if not fut.done():
                fut.set_exception(error)
        if self._transport is not None:
            self._transport.abort()

    def close(self) -> None:
        self._fail(StoreUnavailableError(f"redis at {self._url}: connection closed"))


class RedisStore:
    """Coordinator state in Redis.

    Args:
        url: ``redis://host:port/db``.
        namespace: key prefix, so several coordinators (or tests) can share one Redis.
        timeout_s: socket timeout; an unreachable Redis fails calls within about this long.
    """

    def __init__(self, url: str, *, namespace: str = "rollmux", timeout_s: float = 2.0) -> None:
        self.url = url
        self._r = aioredis.Redis.from_url(url, socket_timeout=timeout_s, socket_connect_timeout=timeout_s,
                                          decode_responses=True, retry_on_timeout=False)
        self._state, self._fence, self._leader = f"{namespace}:state", f"{namespace}:fence", f"{namespace}:leader"
        self._timeout_s = timeout_s
        self._commit = self._r.register_script(_COMMIT)
        self._commit_sha = hashlib.sha1(_COMMIT.encode()).hexdigest().encode()
        self._conn: _CommitConnection | None = None
        kw = self._r.connection_pool.connection_kwargs
        cls = self._r.connection_pool.connection_class
        self._handshake = [_resp(["AUTH", *([kw["username"]] if kw.get("username") else []), kw["password"]])
                           ] if kw.get("password") else []
        if int(kw.get("db") or 0):
            self._handshake.append(_resp(["SELECT", str(int(kw["db"]))]))
        if cls is Connection:
            self._address: tuple[str, object] | None = ("tcp", (kw.get("host", "localhost"), int(kw.get("port", 6379))))
        elif cls is UnixDomainSocketConnection:
            self._address = ("unix", kw["path"])
        else:  # TLS and anything else: commit through redis-py
            self._address = None
        self._acquire = self._r.register_script(_ACQUIRE)
        self._renew = self._r.register_script(_RENEW)

    async def _call(self, coro):  # type: ignore[no-untyped-def]
        try:
            return await coro
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise StoreUnavailableError(f"redis at {self.url} is unreachable: {exc}") from exc
        except ResponseError as exc:
            if STALE_FENCE in str(exc):
                raise StaleFenceError(f"commit refused by redis: {exc}; another coordinator took over") from exc
            raise StoreError(f"redis at {self.url} refused a command: {exc}") from exc
        except RedisError as exc:
            raise StoreUnavailableError(f"redis at {self.url} failed: {exc}") from exc

    async def ping(self) -> None:
        await self._call(self._r.ping())

    async def load(self) -> dict[str, str]:
        return dict(await self._call(self._r.hgetall(self._state)))

    @staticmethod
    def _commit_args(writes: Mapping[str, str | None], fence: int) -> list[str]:
        sets = [(k, v) for k, v in writes.items() if v is not None]
        args: list[str] = [str(fence), str(len(sets))]
        for k, v in sets:
            args += (k, v)  # type: ignore[arg-type]
        args += [k for k, v in writes.items() if v is None]
        return args

    async def commit(self, writes: Mapping[str, str | None], *, fence: int) -> None:
        await self.commit_future(writes, fence=fence)

    def commit_future(self, writes: Mapping[str, str | None], *, fence: int) -> asyncio.Future[bytes]:
        """Send one commit now; the future is resolved when Redis answers (the committer's hot path).

        Commits sent one after another on the open connection are applied in order; the caller (the
        committer) keeps one batch in flight, so a reconnect never reorders them.

        Raises (through the future): as `commit`.
        """
        conn = self._conn
        if conn is None or conn.closed:
            return asyncio.ensure_future(self._commit_slow(writes, fence))
        args = self._commit_args(writes, fence)
        return conn.send(_resp([b"EVALSHA", self._commit_sha, b"2", self._state, self._fence, *args]))

    async def _commit_slow(self, writes: Mapping[str, str | None], fence: int) -> bytes:
        """Open the commit connection (loading the script) and commit; redis-py when there is no fast path."""
        if self._address is None:
            await self._call(self._commit(keys=[self._state, self._fence], args=self._commit_args(writes, fence)))
            return b":1"
        await self._call(self._r.script_load(_COMMIT))
        loop = asyncio.get_running_loop()
        kind, where = self._address
        try:
            if kind == "tcp":
                host, port = where  # type: ignore[misc]
                connect = loop.create_connection(lambda: _CommitConnection(self.url, self._timeout_s), host, port)
            else:
                connect = loop.create_unix_connection(lambda: _CommitConnection(self.url, self._timeout_s),
                                                      where)  # type: ignore[arg-type]
            _, conn = await asyncio.wait_for(connect, self._timeout_s)
        except (OSError, asyncio.TimeoutError) as exc:
            raise StoreUnavailableError(f"redis at {self.url} is unreachable: {exc!r}") from exc
        try:
            for command in self._handshake:
                await conn.send(command)
        except StoreError:
            conn.close()
            raise
        if self._conn is not None:
            self._conn.close()
        self._conn = conn
        return await self.commit_future(writes, fence=fence)

    async def acquire_leadership(self, owner: str, ttl_s: float) -> int | None:
        fence = int(await self._call(self._acquire(keys=[self._leader, self._fence],
                                                   args=[owner, int(ttl_s * 1000)])))
        return fence or None

    async def renew_leadership(self, owner: str, fence: int, ttl_s: float) -> bool:
        ok = await self._call(self._renew(keys=[self._leader, self._fence],
                                          args=[owner, str(fence), int(ttl_s * 1000)]))
        return bool(int(ok))

    async def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None
        await self._r.aclose()
