"""`RedisStore`: the coordinator's records in one Redis hash, written by Lua scripts.

Layout (``ns`` defaults to ``rollmux``):
- ``{ns}:state``  hash, field = record key (``job/a``, ``permit/a``, ...), value = JSON text;
- ``{ns}:fence``  integer, the latest leader fence (only ever incremented);
- ``{ns}:leader`` ``"<owner> <fence>"`` with a TTL: the leadership lease.

Each commit is one Lua script: it checks the fence and applies every set and delete of the batch,
so Redis never holds half a transition, and a deposed leader's writes are refused.
"""

from __future__ import annotations

from collections.abc import Mapping

import redis.asyncio as aioredis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from rollmux.coordinator.service.api import StaleFenceError, StoreError, StoreUnavailableError

_COMMIT = """
local cur = redis.call('GET', KEYS[2])
if cur ~= ARGV[1] then
  return redis.error_reply('STALE_FENCE current=' .. tostring(cur) .. ' got=' .. ARGV[1])
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
        self._commit = self._r.register_script(_COMMIT)
        self._acquire = self._r.register_script(_ACQUIRE)
        self._renew = self._r.register_script(_RENEW)

    async def _call(self, coro):  # type: ignore[no-untyped-def]
        try:
            return await coro
        except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
            raise StoreUnavailableError(f"redis at {self.url} is unreachable: {exc}") from exc
        except ResponseError as exc:
            if "STALE_FENCE" in str(exc):
                raise StaleFenceError(f"commit refused by redis: {exc}; another coordinator took over") from exc
            raise StoreError(f"redis at {self.url} refused a command: {exc}") from exc
        except RedisError as exc:
            raise StoreUnavailableError(f"redis at {self.url} failed: {exc}") from exc

    async def ping(self) -> None:
        await self._call(self._r.ping())

    async def load(self) -> dict[str, str]:
        return dict(await self._call(self._r.hgetall(self._state)))

    async def commit(self, writes: Mapping[str, str | None], *, fence: int) -> None:
        sets = [(k, v) for k, v in writes.items() if v is not None]
        dels = [k for k, v in writes.items() if v is None]
        args: list[str | int] = [str(fence), len(sets)]
        for k, v in sets:
            args += [k, v]
        args += dels
        await self._call(self._commit(keys=[self._state, self._fence], args=args))

    async def acquire_leadership(self, owner: str, ttl_s: float) -> int | None:
        fence = int(await self._call(self._acquire(keys=[self._leader, self._fence],
                                                   args=[owner, int(ttl_s * 1000)])))
        return fence or None

    async def renew_leadership(self, owner: str, fence: int, ttl_s: float) -> bool:
        ok = await self._call(self._renew(keys=[self._leader, self._fence],
                                          args=[owner, str(fence), int(ttl_s * 1000)]))
        return bool(int(ok))

    async def close(self) -> None:
        await self._r.aclose()
