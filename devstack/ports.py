"""Free loopback ports for the embedded servers, booked so two stacks never pick the same one."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import random
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from devstack.errors import StackError

HOST = "127.0.0.1"
# weed listens on each HTTP port and on that port + 10000 for gRPC, and loops on
# "invalid port" above 55535, so its ports stay in 20000-45000.
PORT_FLOOR = 20000

PORT_CEILING = 45000

# Ports handed out recently, shared by every stack of this user so that two stacks starting
# at once never pick the same port in the gap between our bind test and the child's bind.
PORT_BOOK = Path(tempfile.gettempdir()) / f"footnote-ports-{os.getuid()}.json"

PORT_HOLD_SECONDS = 120.0


def allocate_ports(owner: str, wanted: dict[str, tuple[int | None, int]]) -> dict[str, int]:
    """Free loopback ports, one per key; each value is (preferred port, partner offset).

    A port with a partner offset is only chosen when the partner (port + offset) is free too.
    Ports held in the book by another owner (state dir) are skipped; our own may be reused.
    """
    rng = random.SystemRandom()
    chosen: dict[str, int] = {}
    taken: set[int] = set()  # this call's ports, partners included
    with port_book() as book:
        for key, (preferred, offset) in wanted.items():
            span = port_range(offset)

            def usable(port: int, offset: int = offset) -> bool:
                pair = {port, port + offset}
                return (
                    port + offset <= 65535
                    and not pair & taken
                    and all(book.get(p, (0.0, owner))[1] == owner for p in pair)
                    and all(is_bindable(p) for p in pair)
                )

            candidates = [preferred] if preferred else []
            candidates += [rng.randrange(span.start, span.stop) for _ in range(200)]
            port = next((p for p in candidates if usable(p)), None)
            if port is None:
                raise StackError(f"no free port for {key} in {span.start}-{span.stop - 1}")
            until = time.time() + PORT_HOLD_SECONDS
            for held in {port, port + offset}:
                book[held] = (until, owner)
                taken.add(held)
            chosen[key] = port
    return chosen


def port_range(offset: int) -> range:
    """Ports below the kernel's ephemeral range, so outgoing connections cannot take them."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    top = min(low, PORT_CEILING + 1) - offset
    if top - PORT_FLOOR < 1000:
        top = PORT_CEILING + 1 - offset
    return range(PORT_FLOOR, top)


def is_bindable(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        # Like the servers themselves: a port whose old connections linger in TIME_WAIT is free.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((HOST, port))
        except OSError:
            return False
    return True


@contextlib.contextmanager
def port_book() -> Iterator[dict[int, tuple[float, str]]]:
    """Ports recently handed out by any stack of this user, as port -> (until, owner).

    Held under an exclusive file lock while the caller picks and records its ports.
    """
    try:
        f = PORT_BOOK.open("a+")
    except OSError:
        yield {}  # no shared book: fall back to bind tests alone
        return
    with f:
        fcntl.flock(f, fcntl.LOCK_EX)
        f.seek(0)
        now = time.time()
        try:
            raw = json.loads(f.read() or "{}")
            book = {int(p): (float(t), str(o)) for p, (t, o) in raw.items() if float(t) > now}
        except (ValueError, TypeError, AttributeError):
            book = {}
        yield book
        f.seek(0)
        f.truncate()
        json.dump({str(p): [t, o] for p, (t, o) in book.items()}, f)
