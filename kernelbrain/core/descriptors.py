"""Named file descriptors passed between processes (SCM_RIGHTS over a Unix socket pair): how a child's
outputs in GPU memory (kernelbrain/child/cuda_vmm.py) reach the judge without a host copy.

Each sandboxed child gets one end of a pair, its number in KB_DESCRIPTORS_FD. A child `give`s a
descriptor under a name (an outbox file's); the worker `drain`s what its candidate child gave after each
reply and `send`s it on to the judge before the judge's next request; the judge `take`s it by name and
`discard`s what it did not take after each request. A descriptor is only a handle: what it holds is
checked by whoever opens it, so a child that sends garbage gains nothing but an unreadable output."""

from __future__ import annotations

import contextlib
import os
import socket

ENV = "KB_DESCRIPTORS_FD"
MAX_NAME = 255  # bytes of a name: an outbox file's
MAX_HELD = 4096  # descriptors a process holds from one request: more is a child flooding the socket

_held: dict[str, int] = {}  # the judge's: what it received and has not taken, by name
_sock: list[socket.socket] = []  # this child's end, opened at first use


class Missing(Exception):
    """No descriptor came under the name asked for."""


def pair() -> tuple[socket.socket, int]:
    """A new pair: the worker's end, and the descriptor of the child's (inheritable; the worker closes
    its copy once the child started)."""
    mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    mine.setblocking(False)
    theirs.set_inheritable(True)
    return mine, theirs.detach()


SEND_TIMEOUT_S = 10.0  # a receiver that reads nothing for this long: the send fails (OSError)


def send(sock: socket.socket, name: str, fd: int) -> None:
    """Pass `fd` under `name` (the caller still closes its copy). Waits while the receiver's buffer is
    full, up to SEND_TIMEOUT_S: a receiver that never reads cannot hang the sender."""
    raw = name.encode()[:MAX_NAME]
    sock.settimeout(SEND_TIMEOUT_S)
    try:
        socket.send_fds(sock, [raw], [fd])
    finally:
        sock.setblocking(False)


def drain(sock: socket.socket) -> list[tuple[str, int]]:
    """What arrived on `sock` so far, in order, without waiting."""
    got: list[tuple[str, int]] = []
    while True:
        try:
            data, fds, _, _ = socket.recv_fds(sock, MAX_NAME, 1, socket.MSG_DONTWAIT)
        except (BlockingIOError, InterruptedError):
            return got
        except OSError:
            return got  # the other end is gone
        if not data and not fds:
            return got  # the other end closed
        for fd in fds[1:]:
            os.close(fd)
        if fds:
            if len(got) >= MAX_HELD:
                os.close(fds[0])
                continue
            got.append((data.decode(errors="replace"), fds[0]))


def close_all(named: list[tuple[str, int]]) -> None:
    for _, fd in named:
        with contextlib.suppress(OSError):
            os.close(fd)


def _channel() -> socket.socket | None:
    if not _sock:
        raw = os.environ.get(ENV, "")
        if not raw.isdigit():
            return None
        _sock.append(socket.socket(fileno=int(raw)))
        _sock[0].setblocking(False)
    return _sock[0]


def available() -> bool:
    """Whether this process was started with a channel to its worker."""
    return _channel() is not None


def give(name: str, fd: int) -> None:
    """Pass `fd` to the worker under `name` (this process still closes its copy)."""
    sock = _channel()
    if sock is None:
        raise Missing("this process has no channel to its worker")
    send(sock, name, fd)


def take(name: str) -> int:
    """The descriptor given under `name` (the caller's to close); Missing where none came."""
    sock = _channel()
    if sock is not None:
        for key, fd in drain(sock):
            if key in _held:
                os.close(_held.pop(key))  # an older one of the same name: the latest counts
            if len(_held) < MAX_HELD:
                _held[key] = fd
            else:
                os.close(fd)
    if name not in _held:
        raise Missing(f"no descriptor came for {name}")
    return _held.pop(name)


def held_names() -> list[str]:
    """The names of what this process received and has not taken yet."""
    return list(_held)


def forget_channel() -> None:
    """Drop this process's channel (not closing it) and close what it held: the next use reads
    KB_DESCRIPTORS_FD again (a test that changes it)."""
    for sock in _sock:
        sock.detach()  # the descriptor stays open: whoever set KB_DESCRIPTORS_FD closes it
    _sock.clear()
    close_all(list(_held.items()))
    _held.clear()


def discard() -> None:
    """Close every descriptor received and not taken (after each request: nothing carries over)."""
    sock = _channel()
    named = drain(sock) if sock is not None else []
    named += list(_held.items())
    _held.clear()
    close_all(named)
