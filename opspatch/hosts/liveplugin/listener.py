"""One engine process's socket: a folder only root and the engine's user can enter, a Unix socket
that accepts only their uids (SO_PEERCRED), one thread per connection, one request and one reply."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import socket
import stat
import struct
import threading
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from . import socket_paths, wire

# Under the engine's own logger, so its lines have the engine's format and go to its log.
logger = logging.getLogger("sglang.opspatch_live")

READ_TIMEOUT_S = 10.0
"""How long a connection may take to send its request line."""

if TYPE_CHECKING:  # a subscripted alias is evaluated at run time, which Python 3.8 refuses
    Answer = Callable[[dict[str, Any]], dict[str, Any]]


class LiveDirError(Exception):
    """The socket's folder or path cannot be used safely; the message says what to do."""


def peer_uid(connection: socket.socket) -> int:
    """The uid of the process at the other end of a Unix socket (Linux SO_PEERCRED)."""
    size = struct.calcsize("3i")
    _pid, uid, _gid = struct.unpack(
        "3i", connection.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, size)
    )
    return int(uid)


def _owned_folder(path: str, uid: int, private: bool) -> None:
    """Make `path` (mode 0700) unless it exists, then check it: a real folder, owned by `uid`
    (or root, for a shared base), writable by nobody else; `private`: no access for others at all.

    Raises:
        LiveDirError: it is not such a folder.
    """
    with contextlib.suppress(FileExistsError):
        os.makedirs(path, 0o700)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode):
        raise LiveDirError(f"{path} is not a folder (a symlink or a file is never followed)")
    owners = (uid,) if private else (uid, 0)
    if info.st_uid not in owners:
        raise LiveDirError(
            f"{path} belongs to uid {info.st_uid}, not to the engine's user (uid {uid})"
        )
    forbidden = 0o077 if private else 0o022
    if info.st_mode & forbidden:
        wanted = "0700" if private else "writable by its owner only"
        raise LiveDirError(f"{path} has mode {stat.S_IMODE(info.st_mode):o}; it must be {wanted}")


def prepare_socket_path(
    environ: Mapping[str, str], server_pid: int, role: str, rank: int | None
) -> str:
    """The path this process listens at, its folders made and checked.

    Raises:
        LiveDirError: a folder is not safe (see `_owned_folder`) or the path is too long.
    """
    uid = os.geteuid()
    base = socket_paths.base_dir(environ, uid)
    folder = socket_paths.server_dir(base, server_pid)
    path = os.path.join(folder, socket_paths.socket_name(role, rank))
    if len(path.encode("utf-8")) > socket_paths.MAX_SOCKET_PATH:
        raise LiveDirError(
            f"the socket path {path} is longer than a Unix socket allows; set {socket_paths.LIVE_DIR_ENV} to a shorter folder"
        )
    _owned_folder(base, uid, private=False)
    _owned_folder(folder, uid, private=True)
    return path


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # another user's process: there
        return False
    return False


def remove_dead_servers(base: str, keep: int) -> list[str]:
    """Remove the socket folders under `base` of servers whose main process is gone: real SGLang
    stopped by a signal ends its main process with its own SIGKILL (`kill_process_tree`), so no
    exit handler removes its folder. Only this user's folders named by a pid that runs no
    process, holding nothing but sockets, and never `keep`'s; the folders removed."""
    removed: list[str] = []
    try:
        names = os.listdir(base)
    except OSError:
        return removed
    for name in names:
        if not name.isdigit() or int(name) == keep or not _gone(int(name)):
            continue
        folder = os.path.join(base, name)
        try:
            info = os.lstat(folder)
            if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.geteuid():
                continue
            entries = [os.path.join(folder, entry) for entry in os.listdir(folder)]
            if not all(stat.S_ISSOCK(os.lstat(entry).st_mode) for entry in entries):
                continue
            for entry in entries:
                os.unlink(entry)
            os.rmdir(folder)
        except OSError:
            continue
        removed.append(folder)
    return removed


def _remove_stale(path: str) -> None:
    """Remove a socket left at `path` by a process that is gone (the pid was reused).

    Raises:
        LiveDirError: something else is there, or a live process listens on it.
    """
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(info.st_mode):
        raise LiveDirError(f"{path} exists and is not a socket")
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(path)
        except OSError as error:
            if error.errno not in (errno.ECONNREFUSED, errno.ENOENT):
                raise LiveDirError(f"cannot tell whether {path} is in use: {error}") from None
        else:
            raise LiveDirError(f"another process listens on {path}")
    os.unlink(path)


class Listener:
    """The socket of one process: `answer` is called for each request of an allowed peer, on
    that connection's own thread (an entry rank's take waits there for a boundary)."""

    def __init__(self, path: str, answer: Answer) -> None:
        self.path = path
        self.answer = answer
        self.allowed_uids = frozenset((0, os.geteuid()))
        self._socket: socket.socket | None = None

    def start(self) -> None:
        """Bind, listen and serve on a daemon thread.

        Raises:
            LiveDirError: the path is taken by something else or a live listener.
            OSError: the socket cannot be bound.
        """
        _remove_stale(self.path)
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            server.bind(self.path)
            os.chmod(self.path, 0o600)
            server.listen(16)
        except OSError:
            server.close()
            raise
        self._socket = server
        threading.Thread(target=self._serve, name="opspatch-live", daemon=True).start()

    def close(self) -> None:
        """Stop accepting and remove the socket file."""
        if self._socket is not None:
            with contextlib.suppress(OSError):
                self._socket.close()
            self._socket = None
        with contextlib.suppress(OSError):
            os.unlink(self.path)

    def _serve(self) -> None:
        server = self._socket
        while server is not None:
            try:
                connection, _ = server.accept()
            except OSError:
                return  # closed
            threading.Thread(
                target=self._answer_one,
                args=(connection,),
                name="opspatch-live-request",
                daemon=True,
            ).start()

    def _answer_one(self, connection: socket.socket) -> None:
        with connection:
            try:
                connection.settimeout(READ_TIMEOUT_S)
                uid = peer_uid(connection)
                if uid not in self.allowed_uids:
                    logger.warning(
                        "opspatch live: refused a peer with uid %d on %s", uid, self.path
                    )
                    _drop_request(connection)
                    reply = wire.refusal(
                        wire.PEER_NOT_ALLOWED,
                        f"uid {uid} may not use this socket: only root and the engine's user "
                        f"(uid {os.geteuid()})",
                    )
                else:
                    reply = self._reply_to(connection)
                connection.settimeout(None)
                connection.sendall(wire.encode(reply))
            except OSError as error:
                logger.warning("opspatch live: a connection on %s failed: %s", self.path, error)

    def _reply_to(self, connection: socket.socket) -> dict[str, Any]:
        with connection.makefile("rb") as stream:
            try:
                request = wire.read_document(stream)
            except wire.WireError as error:
                return wire.refusal(error.code, error.message)
        try:
            return self.answer(request)
        except Exception as error:  # the engine's process must never see the plugin fail
            logger.exception("opspatch live: answering on %s failed", self.path)
            return wire.refusal(wire.PLUGIN_ERROR, f"{type(error).__name__}: {error}")


def _drop_request(connection: socket.socket) -> None:
    """Read a refused peer's request line and never act on it: closed before it was read, the
    peer's send could fail (a broken pipe) before it read why it was refused."""
    try:
        with connection.makefile("rb") as stream:
            stream.readline(wire.MAX_LINE_BYTES + 1)
    except OSError:
        pass  # none came in time: it is told all the same
