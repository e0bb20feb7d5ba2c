"""Rate limits on preparing environments: a token bucket (steady rate, bursts) and a sliding window (a
registry's "at most N pulls per hour")."""

from __future__ import annotations

import asyncio
import collections
import logging
import time
from collections.abc import Callable

log = logging.getLogger(__name__)


class TokenBucket:
    """At most `burst` acquisitions back to back, then `rate_per_s` per second on average."""

    def __init__(self, rate_per_s: float, burst: int, clock: Callable[[], float] = time.monotonic) -> None:
        if rate_per_s <= 0 or burst < 1:
            raise ValueError(f"TokenBucket needs rate_per_s > 0 and burst >= 1, got {rate_per_s}, {burst}")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self.clock = clock
        self._tokens = float(burst)
        self._updated = clock()
        self._lock = asyncio.Lock()

    def _refill(self) -> None:
        now = self.clock()
        self._tokens = min(self.burst, self._tokens + (now - self._updated) * self.rate_per_s)
        self._updated = now

    async def acquire(self) -> float:
        """Take one token, waiting for it; returns the seconds waited."""
        waited = 0.0
        async with self._lock:  # first come, first served
            self._refill()
            while self._tokens < 1.0:
                pause = (1.0 - self._tokens) / self.rate_per_s
                await asyncio.sleep(pause)
                waited += pause
                self._refill()
            self._tokens -= 1.0
        return waited


class WindowLimit:
    """At most `limit` acquisitions in any `window_s` seconds (Docker Hub's pulls per hour are counted so);
    a caller past it waits, and the wait is logged with what it waits for."""

    def __init__(self, limit: int, window_s: float, what: str, clock: Callable[[], float] = time.monotonic) -> None:
        if limit < 1 or window_s <= 0:
            raise ValueError(f"WindowLimit needs limit >= 1 and window_s > 0, got {limit}, {window_s}")
        self.limit = limit
        self.window_s = window_s
        self.what = what
        self.clock = clock
        self._times: collections.deque[float] = collections.deque()
        self._lock = asyncio.Lock()

    def used(self) -> int:
        """Acquisitions inside the current window."""
        self._expire()
        return len(self._times)

    def _expire(self) -> None:
        now = self.clock()
        while self._times and now - self._times[0] >= self.window_s:
            self._times.popleft()

    async def acquire(self) -> float:
        """Take one slot of the window, waiting for the oldest to leave it; returns the seconds waited."""
        waited = 0.0
        async with self._lock:
            self._expire()
            while len(self._times) >= self.limit:
                pause = max(0.0, self._times[0] + self.window_s - self.clock())
                log.warning(
                    "%s: %d in the last %.0f s (the limit): waiting %.1f s for the next one",
                    self.what,
                    len(self._times),
                    self.window_s,
                    pause,
                )
                await asyncio.sleep(pause)
                waited += pause
                self._expire()
            self._times.append(self.clock())
        return waited
