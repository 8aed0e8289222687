"""Keeps gRPC's completions flowing to the event loop when a turn of the loop runs long.

grpc.aio (grpcio 1.85) hands completed operations to the event loop through a socket pair: its
poller thread queues each completion and writes one byte, and the loop's reader for the other
end reads one byte and runs every completion queued. Under load there are many more
completions than turns of the loop, so the bytes pile up; at about 280 unread bytes (each a
buffer of its own, against the socket's 208 KiB) the poller thread blocks in its write. From
then on it can queue one completion for each byte read, one a turn of the loop, and every
call on the server waits: measured at 1,000 streams, the whole connection sent nothing for
100-400 ms while the loop was busy and hundreds of sends waited for their completions.

`drain_wakeups` puts a reader of our own in front of gRPC's: it reads every byte but one
(gRPC's reader reads that one, and must find it, as its socket blocks) and then runs gRPC's
reader, which runs every completion queued. The poller thread then never waits longer than
one turn of the loop. This reaches into grpc's private objects, so every step is checked and
the server runs as before, with a warning, when anything is not where it is expected.
"""

from __future__ import annotations

import array
import asyncio
import fcntl
import functools
import gc
import logging
import socket
import termios
from collections.abc import Callable

log = logging.getLogger(__name__)


def drain_wakeups(loop: asyncio.AbstractEventLoop) -> bool:
    """Installs the reader on loop, where grpc.aio runs; call on loop once gRPC's aio is
    initialised there (a grpc.aio server or channel made). Whether it was installed."""
    found = wakeup_socket(loop)
    if found is None:
        log.warning("grpc.aio's wake-up socket not found; its wake-ups are left as they are")
        return False
    sock, handle_events = found
    loop.remove_reader(sock)
    loop.add_reader(sock, _reader(sock, handle_events))
    return True


def wakeup_socket(
    loop: asyncio.AbstractEventLoop,
) -> tuple[socket.socket, Callable[[], None]] | None:
    """The socket gRPC's poller thread wakes loop through, and gRPC's reader for it."""
    queues = [o for o in gc.get_objects() if type(o).__name__ == "PollerCompletionQueue"]
    bound = [
        r[loop]
        for q in queues
        for r in gc.get_referents(q)
        if isinstance(r, dict) and loop in r  # its loops: asyncio loop -> _BoundEventLoop
    ]
    if len(queues) != 1 or len(bound) != 1 or not hasattr(queues[0], "_handle_events"):
        return None
    sock = getattr(bound[0], "read_socket", None)
    if not isinstance(sock, socket.socket):
        return None
    return sock, functools.partial(queues[0]._handle_events, loop)


def unread_bytes(sock: socket.socket) -> int:
    """Bytes waiting to be read on sock."""
    count = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, count, True)
    return count[0]


def _reader(sock: socket.socket, handle_events: Callable[[], None]) -> Callable[[], None]:
    def on_readable() -> None:
        unread = unread_bytes(sock)
        if unread > 1:
            sock.recv(unread - 1, socket.MSG_DONTWAIT)
        handle_events()

    return on_readable
