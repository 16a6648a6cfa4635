"""The shared store's client: leases, membership and rates of several edges in one Redis (or
Valkey) server, through redis-py's asyncio client.

Keys (``prefix`` is ``iop-edge`` unless told otherwise; times are milliseconds of the server's
clock, or of ``now_ms`` when a test gives one):

- ``{prefix}:lease:{provider}``: a sorted set of the provider's general leases, each a lease id
  scored with its expiry; ``{prefix}:long:{provider}``: its long-context leases;
  ``{prefix}:principal:{ref}``: the in-flight leases of a principal;
- ``{prefix}:rate:{ref}``: a principal's request-rate bucket (a hash: ``tokens``, ``at``);
- ``{prefix}:members``: the live edges, instance id scored with its expiry;
- channel ``{prefix}:released``: one message per release that freed something.

A lease id is ``{instance_id}:{seq}``. Each operation is one script (:mod:`.scripts`), one
round trip on the hot path (``acquire``, ``release``); every call is bounded by
``op_timeout``, and any failure of the store (refused, lost, too slow, a script error) raises
:class:`StoreUnavailable` with the URL's password hidden.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, Final, Literal, TypeVar, cast, get_args
from urllib.parse import urlsplit

from redis.asyncio import BlockingConnectionPool, Redis
from redis.asyncio.retry import Retry
from redis.backoff import NoBackoff
from redis.exceptions import RedisError

from iop_edge.errors import StoreUnavailable
from iop_edge.shared import scripts
from iop_edge.shared.records import (
    HIDDEN,
    LATENCY_BUCKETS,
    Grant,
    LeaseRef,
    ProviderView,
    Released,
    StoreStatistics,
    StoreView,
    decode_released,
    redact_store_url,
)

__all__ = [
    "LATENCY_BUCKETS",
    "OPS",
    "Grant",
    "LeaseRef",
    "ProviderView",
    "Released",
    "SharedStore",
    "StoreStatistics",
    "StoreUnavailable",
    "StoreView",
    "redact_store_url",
]

T = TypeVar("T")

#: the operations of a store, as named in its statistics and errors
Op = Literal[
    "connect",
    "acquire",
    "release",
    "renew",
    "reassert",
    "heartbeat",
    "leave",
    "view",
    "take_rate",
    "listen",
]
OPS: Final[tuple[Op, ...]] = get_args(Op)
#: leases per script call of ``renew`` and ``reassert`` (each has up to 3 keys and 2 arguments)
BATCH: Final = 200
SCHEMES: Final = ("redis", "rediss", "unix")


class _Tally:
    """The counters behind :meth:`SharedStore.statistics` (kept once, read as a snapshot)."""

    __slots__ = ("bucket_counts", "calls", "count", "errors", "last_error", "total")

    def __init__(self) -> None:
        self.calls: dict[str, int] = dict.fromkeys(OPS, 0)
        self.errors: dict[str, int] = dict.fromkeys(OPS, 0)
        self.bucket_counts = [0] * len(LATENCY_BUCKETS)
        self.total = 0.0
        self.count = 0
        self.last_error: str | None = None

    def observe(self, seconds: float) -> None:
        self.total += seconds
        self.count += 1
        for i, bound in enumerate(LATENCY_BUCKETS):
            if seconds <= bound:
                self.bucket_counts[i] += 1
                break

    def snapshot(self) -> StoreStatistics:
        cumulative: list[int] = []
        running = 0
        for n in self.bucket_counts:
            running += n
            cumulative.append(running)
        return StoreStatistics(
            calls=dict(self.calls),
            errors=dict(self.errors),
            latency_buckets=LATENCY_BUCKETS,
            latency_counts=tuple(cumulative),
            latency_sum=self.total,
            latency_count=self.count,
            last_error=self.last_error,
        )


class SharedStore:
    """The client of one shared store, for one edge process (``instance_id``).

    ``url``: ``redis://``, ``rediss://`` or ``unix://`` (redis-py's URL forms, password
    included). ``op_timeout``: seconds each round trip may take. ``now_ms``: a clock of
    milliseconds for the scripts instead of the server's (tests). ``max_connections``: the
    pool's bound (a call waits for a free connection within its ``op_timeout``).

    Made without I/O; :meth:`connect` checks the store and loads the scripts, but every
    operation also connects by itself (and after the store came back).
    """

    def __init__(
        self,
        url: str,
        *,
        instance_id: str,
        prefix: str = "iop-edge",
        op_timeout: float = 0.5,
        now_ms: Callable[[], int] | None = None,
        max_connections: int = 64,
    ) -> None:
        scheme = urlsplit(url).scheme
        shown = redact_store_url(url)
        if scheme not in SCHEMES:
            raise ValueError(
                f"shared store URL {shown!r}: the scheme {scheme!r} is not one of "
                "redis://, rediss:// or unix://"
            )
        if not instance_id or ":" in instance_id:
            raise ValueError(
                f"instance_id {instance_id!r} must be non-empty and without ':' "
                "(a lease id is the instance id, ':', a sequence number)"
            )
        if not op_timeout > 0:
            raise ValueError(f"op_timeout {op_timeout!r} must be above 0 seconds")
        self.instance_id = instance_id
        self.prefix = prefix
        self.op_timeout = op_timeout
        #: the store's URL with its password hidden (for status, logs and errors)
        self.redacted_url = shown
        self.channel = f"{prefix}:released"
        self._members_key = f"{prefix}:members"
        self._version_key = f"{prefix}:version"
        self._password = urlsplit(url).password
        self._now_ms = now_ms
        self._tally = _Tally()
        pool = BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=op_timeout,
            socket_timeout=op_timeout,
            socket_connect_timeout=op_timeout,
            # a failed call is reported, not repeated: the caller decides (a retried take of
            # a rate token could take two)
            retry=Retry(NoBackoff(), 0),
            decode_responses=True,
        )
        self._redis = Redis.from_pool(pool)  # (owns the pool: aclose() closes it)
        self._acquire = self._redis.register_script(scripts.ACQUIRE)
        self._release = self._redis.register_script(scripts.RELEASE)
        self._renew = self._redis.register_script(scripts.RENEW)
        self._reassert = self._redis.register_script(scripts.REASSERT)
        self._heartbeat = self._redis.register_script(scripts.HEARTBEAT)
        self._view = self._redis.register_script(scripts.VIEW)
        self._take_rate = self._redis.register_script(scripts.TAKE_RATE)
        self._all_scripts = (
            self._acquire,
            self._release,
            self._renew,
            self._reassert,
            self._heartbeat,
            self._view,
            self._take_rate,
        )

    # -- keys -------------------------------------------------------------------------------

    def lease_key(self, provider: str) -> str:
        """The sorted set of ``provider``'s general leases."""
        return f"{self.prefix}:lease:{provider}"

    def long_key(self, provider: str) -> str:
        """The sorted set of ``provider``'s long-context leases."""
        return f"{self.prefix}:long:{provider}"

    def principal_key(self, principal: str) -> str:
        """The sorted set of ``principal``'s in-flight leases."""
        return f"{self.prefix}:principal:{principal}"

    def rate_key(self, principal: str) -> str:
        """The hash of ``principal``'s request-rate bucket."""
        return f"{self.prefix}:rate:{principal}"

    def _keys(self, lease: LeaseRef, *, long: bool) -> list[str]:
        keys = [self.lease_key(lease.provider)]
        if long:
            keys.append(self.long_key(lease.provider))
        if lease.principal is not None:
            keys.append(self.principal_key(lease.principal))
        return keys

    def _now(self) -> str:
        return "" if self._now_ms is None else str(int(self._now_ms()))

    # -- lifecycle --------------------------------------------------------------------------

    async def connect(self) -> None:
        """Check that the store answers and load the scripts (one round trip)."""

        async def check() -> None:
            async with self._redis.pipeline(transaction=False) as pipe:
                pipe.ping()
                for script in self._all_scripts:
                    pipe.script_load(script.script)
                await pipe.execute()

        await self._call("connect", check)

    async def aclose(self) -> None:
        """Close every connection (the leases stay in the store until released or expired)."""
        await self._redis.aclose()

    # -- leases -----------------------------------------------------------------------------

    async def acquire(
        self,
        lease: LeaseRef,
        *,
        capacity: int,
        long_capacity: int = 0,
        principal_cap: int | None = None,
        ttl_ms: int,
    ) -> Grant:
        """Take ``lease`` in one atomic script: drop the expired leases of its sets, refuse if
        the provider holds ``capacity`` (``provider``), a long lease's provider holds
        ``long_capacity`` long ones (``long``) or its principal holds ``principal_cap``
        (``principal``) — checked in that order, nothing changed on a refusal —, else add it to
        each of its sets, expiring in ``ttl_ms``. Taking a lease id it already holds refreshes
        it and never counts it twice."""
        if principal_cap is not None and lease.principal is None:
            raise ValueError(f"lease {lease.lease_id!r}: a principal_cap needs a principal")
        keys = self._keys(lease, long=True)  # (the long set too: its count is answered)
        args: list[str | int] = [
            self._now(),
            lease.lease_id,
            _positive(ttl_ms, "ttl_ms"),
            capacity,
            "1" if lease.long else "0",
            long_capacity,
            "" if principal_cap is None else principal_cap,
            self._version_key,
        ]
        reply = await self._call("acquire", lambda: self._acquire(keys=keys, args=args))
        refused, held, long_held, principal_held, version, *mine = cast("list[Any]", reply)
        return Grant(
            granted=not refused,
            refused=refused or None,
            held=int(held),
            long_held=int(long_held),
            principal_held=int(principal_held),
            version=int(version),
            mine=(int(mine[0]), int(mine[1]), int(mine[2])),
        )

    async def release(self, lease: LeaseRef) -> Released:
        """Give ``lease`` back, from all its sets, and publish the counts left on
        :attr:`channel` if that freed anything. Releasing a lease the store no longer holds
        changes nothing and still answers the counts."""
        keys = self._keys(lease, long=True)  # (the long set too: its count is answered)
        args: list[str | int] = [
            self._now(),
            lease.lease_id,
            self.channel,
            lease.provider,
            lease.principal or "",
            lease.instance,
            self._version_key,
        ]
        reply = await self._call("release", lambda: self._release(keys=keys, args=args))
        held, long_held, principal_held, version, *mine = (int(n) for n in cast("list[Any]", reply))
        return Released(
            provider=lease.provider,
            held=held,
            long_held=long_held,
            principal=lease.principal,
            principal_held=principal_held,
            instance=lease.instance,
            version=version,
            mine=(mine[0], mine[1], mine[2]),
        )

    async def renew(self, leases: Sequence[LeaseRef], ttl_ms: int) -> list[str]:
        """Push the expiry of every lease still held to ``ttl_ms`` from now; answer the ids of
        those the store no longer holds (expired, or removed): their holders must stop. They
        are removed from their other sets too."""
        ttl = _positive(ttl_ms, "ttl_ms")
        missing: list[str] = []
        for batch in _batches(leases):
            keys, args = self._layout(batch, ttl)
            reply = await self._call("renew", functools.partial(self._renew, keys=keys, args=args))
            missing += [str(lease_id) for lease_id in cast("list[Any]", reply)]
        return missing

    async def reassert(self, leases: Sequence[LeaseRef], ttl_ms: int) -> None:
        """Add (or refresh) every lease in all its sets without any check: the leases this
        edge holds, written back after the store was lost and came back."""
        ttl = _positive(ttl_ms, "ttl_ms")
        for batch in _batches(leases):
            keys, args = self._layout(batch, ttl)
            await self._call("reassert", functools.partial(self._reassert, keys=keys, args=args))

    def _layout(self, leases: Sequence[LeaseRef], ttl: int) -> tuple[list[str], list[str | int]]:
        keys: list[str] = []
        args: list[str | int] = [self._now(), ttl]
        for lease in leases:
            mine = self._keys(lease, long=lease.long)
            keys += mine
            args += [lease.lease_id, len(mine)]
        return keys, args

    # -- membership and views ---------------------------------------------------------------

    async def heartbeat(self, ttl_ms: int) -> int:
        """Mark this instance live for ``ttl_ms``; answer the number of live members."""
        args: list[str | int] = [self._now(), self.instance_id, _positive(ttl_ms, "ttl_ms")]
        keys = [self._members_key]
        reply = await self._call("heartbeat", lambda: self._heartbeat(keys=keys, args=args))
        return int(cast("int", reply))

    async def leave(self) -> None:
        """Remove this instance from the members at once (a clean stop)."""
        await self._call("leave", lambda: self._redis.zrem(self._members_key, self.instance_id))

    async def view(self, providers: Iterable[str], principals: Iterable[str]) -> StoreView:
        """The live counts of ``providers`` and ``principals`` and the live members, expired
        entries dropped first (one script)."""
        names = list(dict.fromkeys(providers))
        refs = list(dict.fromkeys(principals))
        keys = [self._members_key]
        for name in names:
            keys += [self.lease_key(name), self.long_key(name)]
        keys += [self.principal_key(ref) for ref in refs]
        args: list[str | int] = [self._now(), len(names), self._version_key, self.instance_id]
        reply = cast(
            "list[Any]", await self._call("view", lambda: self._view(keys=keys, args=args))
        )
        members, version, *per_provider, per_principal = reply
        seen: dict[str, ProviderView] = {}
        for name, (held, long_held, flat, long_mine) in zip(names, per_provider, strict=True):
            by = {str(flat[i]): int(flat[i + 1]) for i in range(0, len(flat), 2)}
            seen[name] = ProviderView(
                held=int(held), long_held=int(long_held), held_by=by, long_mine=int(long_mine)
            )
        counts = {ref: int(n) for ref, (n, _) in zip(refs, per_principal, strict=True)}
        mine = {ref: int(m) for ref, (_, m) in zip(refs, per_principal, strict=True)}
        return StoreView(
            providers=seen,
            principals=counts,
            members=int(members),
            version=int(version),
            principals_mine=mine,
        )

    # -- rates ------------------------------------------------------------------------------

    async def take_rate(self, principal: str, per_minute: int) -> float | None:
        """Take one token of ``principal``'s bucket of ``per_minute`` (the semantics of
        :class:`iop_edge.pool.rates.RateLimits`, on the store's clock): ``None`` when the
        request may go, else the seconds until it could (nothing taken)."""
        keys = [self.rate_key(principal)]
        args: list[str | int] = [self._now(), _positive(per_minute, "per_minute")]
        reply = await self._call("take_rate", lambda: self._take_rate(keys=keys, args=args))
        return float(reply) if reply else None

    # -- releases of everyone ---------------------------------------------------------------

    async def listen(
        self,
        on_release: Callable[[Released], None],
        *,
        on_subscribed: Callable[[], None] | None = None,
        keepalive: float = 5.0,
    ) -> None:
        """Call ``on_release`` with every release any edge publishes, until cancelled.

        ``on_subscribed`` is called once the subscription is in place (releases from then on
        are seen). When nothing came for ``keepalive`` seconds the connection is checked with
        a ``PING``; a connection lost, or a ``PING`` unanswered within ``op_timeout``, raises
        :class:`StoreUnavailable` (listen again once the store answers). Messages that are no
        release are skipped.
        """
        pubsub = self._redis.pubsub()
        try:
            await self._call("listen", lambda: pubsub.subscribe(self.channel))
            loop = asyncio.get_running_loop()
            heard = loop.time()
            pinged: float | None = None
            while True:
                try:
                    message = await pubsub.get_message(timeout=keepalive)
                    now = loop.time()
                    if message is None and pinged is None and now - heard >= keepalive:
                        await asyncio.wait_for(pubsub.ping(), self.op_timeout)
                        pinged = now
                except (RedisError, OSError) as exc:
                    failure = self._failed("listen", exc)
                    self._fail("listen", str(failure))
                    raise failure from exc
                if message is None:
                    if pinged is not None and now - pinged > self.op_timeout:
                        failure = StoreUnavailable(
                            "listen",
                            f"shared store {self.redacted_url}: listen failed: no answer to "
                            f"PING within {self.op_timeout:g} s",
                        )
                        self._fail("listen", str(failure))
                        raise failure
                    continue
                heard, pinged = now, None
                kind = message.get("type")
                if kind == "subscribe" and on_subscribed is not None:
                    on_subscribed()
                elif kind == "message":
                    released = decode_released(message.get("data"))
                    if released is not None:
                        on_release(released)
        finally:
            await asyncio.shield(_close_quietly(pubsub))

    # -- statistics and errors --------------------------------------------------------------

    def statistics(self) -> StoreStatistics:
        """The counters as of now (a frozen snapshot)."""
        return self._tally.snapshot()

    async def _call(self, op: Op, call: Callable[[], Awaitable[T]]) -> T:
        tally = self._tally
        tally.calls[op] += 1
        task = asyncio.current_task()
        cancelling = task.cancelling() if task is not None else 0
        started = time.perf_counter()
        try:
            async with asyncio.timeout(self.op_timeout):
                result = await call()
        except (RedisError, OSError) as exc:
            tally.observe(time.perf_counter() - started)
            failure = self._failed(op, exc)
            self._fail(op, str(failure))
            raise failure from exc
        tally.observe(time.perf_counter() - started)
        tally.last_error = None
        if task is not None and task.cancelling() > cancelling:
            # redis-py (8.2) can answer a call whose task was cancelled meanwhile (a cancel
            # landing while it hands the connection back to its pool) without raising: the
            # cancel would be lost, and a loop stopped by cancelling its task never stop.
            raise asyncio.CancelledError
        return result

    def _fail(self, op: str, message: str) -> None:
        self._tally.errors[op] += 1
        self._tally.last_error = message

    def _failed(self, op: str, exc: BaseException) -> StoreUnavailable:
        if isinstance(exc, TimeoutError):
            detail = f"no answer within {self.op_timeout:g} s"
        else:
            detail = str(exc) or type(exc).__name__
            if self._password:
                detail = detail.replace(self._password, HIDDEN)
        return StoreUnavailable(op, f"shared store {self.redacted_url}: {op} failed: {detail}")


def _positive(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} {value!r} must be a whole number of at least 1")
    return value


def _batches(leases: Sequence[LeaseRef]) -> Iterable[Sequence[LeaseRef]]:
    for start in range(0, len(leases), BATCH):
        yield leases[start : start + BATCH]


async def _close_quietly(pubsub: Any) -> None:
    # (a connection already gone has nothing left to close)
    with contextlib.suppress(RedisError, OSError):
        await pubsub.aclose()
