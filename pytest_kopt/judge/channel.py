"""The wire between the supervisor and the runner: JSON messages (and file descriptors) over a
Unix socket pair.

Only JSON crosses: never pickle, which would let the runner run code in the supervisor. Each
message is an 8-byte length and a UTF-8 JSON object; descriptors (arenas) ride on the header
as SCM_RIGHTS. The receiving side bounds the size and the number of descriptors, and a peer
that stops answering is a ``ChannelError`` once the caller's deadline passes.
"""

from __future__ import annotations

import array
import json
import math
import socket
import struct
import time
from typing import Any

MAX_MESSAGE = 64 * 1024 * 1024
MAX_FDS = 16
_HEADER = struct.Struct("!Q")


class ChannelError(Exception):
    """The peer hung up, sent garbage, or did not answer in time."""


class Channel:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock

    def fileno(self) -> int:
        return self.sock.fileno()

    def send(self, message: dict, fds: list[int] = ()) -> None:  # type: ignore[assignment]
        body = json.dumps(finite(message), allow_nan=False, default=_plain).encode()
        if len(body) > MAX_MESSAGE:
            raise ChannelError(f"message of {len(body)} bytes is too large")
        header = _HEADER.pack(len(body))
        self.sock.settimeout(None)
        try:
            if fds:
                self.sock.sendmsg([header], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
            else:
                self.sock.sendall(header)
            self.sock.sendall(body)
        except OSError as exc:
            raise ChannelError(f"the peer is gone ({exc.strerror or exc})") from None

    def recv(self, timeout: float | None = None) -> tuple[dict, list[int]]:
        """The next message and the descriptors that came with it; ``timeout`` in seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        fds: list[int] = []
        header = b""
        while len(header) < _HEADER.size:
            self._wait(deadline)
            try:
                data, ancdata, _flags, _addr = self.sock.recvmsg(_HEADER.size - len(header), socket.CMSG_SPACE(MAX_FDS * 4))
            except TimeoutError:
                raise ChannelError("no answer in time") from None
            except OSError as exc:
                raise ChannelError(f"the peer is gone ({exc.strerror or exc})") from None
            for level, kind, payload in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    got = array.array("i")
                    got.frombytes(payload[: len(payload) - len(payload) % 4])
                    fds.extend(got)
            if not data:
                raise ChannelError("the peer closed the connection")
            header += data
        (length,) = _HEADER.unpack(header)
        if length > MAX_MESSAGE:
            raise ChannelError(f"the peer announced a message of {length} bytes")
        chunks, got_bytes = [], 0
        while got_bytes < length:
            self._wait(deadline)
            try:
                data = self.sock.recv(min(length - got_bytes, 1 << 20))
            except TimeoutError:
                raise ChannelError("no answer in time") from None
            except OSError as exc:
                raise ChannelError(f"the peer is gone ({exc.strerror or exc})") from None
            if not data:
                raise ChannelError("the peer closed the connection mid-message")
            chunks.append(data)
            got_bytes += len(data)
        try:
            message = json.loads(b"".join(chunks).decode())
        except (UnicodeDecodeError, ValueError) as exc:
            raise ChannelError(f"the peer sent something that is not JSON ({exc})") from None
        if not isinstance(message, dict):
            raise ChannelError("the peer sent a JSON value that is not an object")
        return message, fds

    def _wait(self, deadline: float | None) -> None:
        if deadline is None:
            self.sock.settimeout(None)
            return
        left = deadline - time.monotonic()
        if left <= 0:
            raise ChannelError("no answer in time")
        self.sock.settimeout(left)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def finite(value: Any) -> Any:
    """``value`` with every non-finite float replaced by None (JSON has no NaN or Infinity)."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [finite(v) for v in value]
    return value


RESULT_STRING_LIMIT = 8000  # characters of any one string in a result (reasons, notes, what a runner said)
RESULT_LIST_LIMIT = 2000  # items of any one list in a result


def bounded(value: Any) -> Any:
    """``value`` with every string cut to RESULT_STRING_LIMIT characters and every list to RESULT_LIST_LIMIT items:
    what reaches the caller is a result, whatever size of answer a runner (the candidate's process) gave."""
    if isinstance(value, str) and len(value) > RESULT_STRING_LIMIT:
        return value[:RESULT_STRING_LIMIT] + f" ... ({len(value) - RESULT_STRING_LIMIT} characters cut)"
    if isinstance(value, dict):
        return {bounded(k): bounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [bounded(v) for v in value[:RESULT_LIST_LIMIT]]
    return value


def _plain(value: Any) -> Any:
    if isinstance(value, set):
        return sorted(value, key=str)
    return str(value)
