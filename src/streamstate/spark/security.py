"""Who may talk to a state host: the job's secret, the HMAC handshake, the run directory.

A state host executes what its clients send (it loads the function a ``JobSpec`` names and runs
it on their records), so only clients of the same query run may reach it:

* **The secret.** The driver draws 32 random bytes per query run (:func:`new_secret`). They
  travel to the tasks inside the task closure (Spark's RPC: enable ``spark.authenticate`` and
  ``spark.network.crypto.enabled`` on an untrusted network) and to a host on its spawner's pipe
  (never on a command line, never in a file). Clients that are not part of a query (tests,
  tools) use the node's secret (:func:`node_secret`), a 0600 file in the run directory.
* **The handshake** (:func:`server_handshake` / :func:`client_handshake`): a challenge-response
  HMAC-SHA256 on every connection, Unix or TCP, before a single framed message is read. The
  secret never crosses the connection; fixed-size messages, so nothing unauthenticated is
  parsed beyond comparing bytes.
* **The run directory** (:func:`run_dir`): sockets, locks and logs live in a directory that must
  be the current user's and closed to group and others, and a Unix-socket peer must run as the
  host's uid (:func:`peer_uid`).
* **The node id** (:func:`node_id`): a random id kept in the run directory names the node in a
  host's location, so two simulated nodes on one machine (two run directories) are two nodes.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import os
import secrets
import socket
import stat
import struct
import uuid

__all__ = [
    "MAGIC",
    "AuthError",
    "client_handshake",
    "new_secret",
    "node_id",
    "node_secret",
    "peer_uid",
    "run_dir",
    "server_handshake",
]

#: the first bytes of both sides of a handshake ("streamstate host protocol 2")
MAGIC = b"SSHOST\x00\x02"
_NONCE = 32
_MAC = 32
SECRET_BYTES = 32


class AuthError(ConnectionError):
    """A handshake failed: the peer does not hold the job's secret (or is not a streamstate
    peer at all)."""


def new_secret() -> bytes:
    """A fresh per-run secret."""
    return secrets.token_bytes(SECRET_BYTES)


def _mac(secret: bytes, role: bytes, host: str, first: bytes, second: bytes) -> bytes:
    msg = b"\0".join((role, host.encode(), first, second))
    return hmac.new(secret, msg, hashlib.sha256).digest()


def _read(sock: socket.socket, n: int, what: str) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            if not buf:
                raise EOFError(f"the peer closed the connection before {what}")
            raise AuthError(f"truncated {what}: {len(buf)} of {n} bytes, then the peer closed")
        buf += chunk
    return bytes(buf)


def server_handshake(sock: socket.socket, secret: bytes, host: str) -> None:
    """The host's side; raises :class:`AuthError` (or ``EOFError``/``OSError``) if the client
    is refused. The socket's timeout bounds a silent client."""
    nonce = os.urandom(_NONCE)
    sock.sendall(MAGIC + nonce)
    try:
        reply = _read(sock, len(MAGIC) + _NONCE + _MAC, "the client's handshake")
    except EOFError as exc:
        raise AuthError("the client closed the connection without a handshake") from exc
    if reply[: len(MAGIC)] != MAGIC:
        raise AuthError(
            f"not a streamstate client of this protocol version (first bytes {reply[:8].hex()})"
        )
    theirs = reply[len(MAGIC) : len(MAGIC) + _NONCE]
    mac = reply[len(MAGIC) + _NONCE :]
    if not hmac.compare_digest(mac, _mac(secret, b"client", host, nonce, theirs)):
        raise AuthError("wrong HMAC: the client does not hold this job's secret")
    sock.sendall(_mac(secret, b"host", host, theirs, nonce))


def client_handshake(sock: socket.socket, secret: bytes, host: str) -> None:
    """The client's side: proves the secret to host ``host`` and checks that it holds it too.
    ``EOFError`` if the peer closed before its challenge (a host going away: try again)."""
    challenge = _read(sock, len(MAGIC) + _NONCE, "the host's challenge")
    if challenge[: len(MAGIC)] != MAGIC:
        raise AuthError(
            f"the peer is not a state host of this protocol version (first bytes "
            f"{challenge[:8].hex()})"
        )
    theirs = challenge[len(MAGIC) :]
    nonce = os.urandom(_NONCE)
    sock.sendall(MAGIC + nonce + _mac(secret, b"client", host, theirs, nonce))
    try:
        proof = _read(sock, _MAC, "the host's proof")
    except EOFError as exc:
        raise AuthError(
            f"the state host {host} refused the handshake (another job's secret or another "
            "host id; see its log)"
        ) from exc
    if not hmac.compare_digest(proof, _mac(secret, b"host", host, nonce, theirs)):
        raise AuthError(f"the peer does not prove it is the state host {host} of this job")


def peer_uid(sock: socket.socket) -> int:
    """The uid of a Unix-socket peer (``SO_PEERCRED``)."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


def check_private_dir(path: str) -> None:
    """Raise ``PermissionError`` unless ``path`` is a directory owned by the current user and
    closed to group and others (a symlink to it must be the user's too)."""
    uid = os.getuid()
    link = os.lstat(path)
    if stat.S_ISLNK(link.st_mode) and link.st_uid != uid:
        raise PermissionError(
            f"state host run directory {path} is a symlink owned by uid {link.st_uid}, not by "
            f"the current user (uid {uid}); refusing to use it"
        )
    st = os.stat(path)
    if not stat.S_ISDIR(st.st_mode):
        raise PermissionError(f"state host run directory {path} is not a directory")
    if st.st_uid != uid:
        raise PermissionError(
            f"state host run directory {path} is owned by uid {st.st_uid}, not by the current "
            f"user (uid {uid}): another user could run code as this job through its sockets; "
            "remove it or set STREAMSTATE_RUN_DIR to a directory of your own"
        )
    mode = stat.S_IMODE(st.st_mode)
    if mode & 0o077:
        raise PermissionError(
            f"state host run directory {path} has mode {mode:04o}: group/other permission bits "
            f"are set; it must be private to its owner (chmod 700 {path})"
        )


def run_dir(override: str | None = None) -> str:
    """The node's directory of host sockets, locks and logs: ``override``, else
    ``$STREAMSTATE_RUN_DIR``, else ``/tmp/streamstate-<uid>``; created with mode 0700. An
    existing directory that is not the current user's or is open to group/others is refused
    (``PermissionError`` naming it)."""
    d = override or os.environ.get("STREAMSTATE_RUN_DIR") or f"/tmp/streamstate-{os.getuid()}"
    with contextlib.suppress(FileExistsError):
        os.makedirs(d, mode=0o700)
    check_private_dir(d)
    return d


def _read_or_create(path: str, make: bytes) -> bytes:
    """The content of ``path``; created (mode 0600, atomically) with ``make`` if absent."""
    try:
        with open(path, "rb") as f:
            data = f.read()
        if data:
            return data
    except FileNotFoundError:
        pass
    tmp = f"{path}.{uuid.uuid4().hex}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, make)
    finally:
        os.close(fd)
    try:
        os.link(tmp, path)  # fails if another process created it first: use theirs
    except FileExistsError:
        pass
    finally:
        os.unlink(tmp)
    with open(path, "rb") as f:
        return f.read()


def node_id(directory: str) -> str:
    """The id of the node (the run directory) ``directory``."""
    return _read_or_create(
        os.path.join(directory, "node-id"), uuid.uuid4().hex[:16].encode()
    ).decode()


def node_secret(directory: str) -> bytes:
    """The node's own secret (0600 in the run directory), for clients outside a query run."""
    return bytes.fromhex(
        _read_or_create(os.path.join(directory, "secret"), new_secret().hex().encode()).decode()
    )
