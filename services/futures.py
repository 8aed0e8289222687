"""Letting go of asyncio futures whose results nobody will read.

asyncio reports a future that failed and was never asked for its outcome ("exception was
never retrieved") when it is collected. An answer starts work it may not use (its early
search, the question's vector, its evidence), so it reads the outcome of what it drops.
"""

from __future__ import annotations

import asyncio
from typing import Any


def read_outcome(future: asyncio.Future[Any]) -> None:
    """Marks a done future's failure, if it had one, as seen; a done-callback."""
    if not future.cancelled():
        future.exception()


def discard(future: asyncio.Future[Any]) -> None:
    """Cancels a future whose result is not wanted; a failure it already had is not reported."""
    if future.done():
        read_outcome(future)
    else:
        future.cancel()
