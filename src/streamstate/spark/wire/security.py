"""Who may talk to a state host: the job's secret, the handshake and its session keys, the run
directory.

A state host executes what its clients send (it loads the function a ``JobSpec`` names and runs
it on their records), so only clients of the same query run may reach it:

* **The secret.** The driver draws 32 random bytes per query run (:func:`new_secret`). They
  travel to the tasks inside the task closure (Spark's RPC: enable ``spark.authenticate`` and
  ``spark.network.crypto.enabled`` on an untrusted network) and to a host on its spawner's pipe
  (never on a command line, never in a file). Clients that are not part of a query (tests,
  tools) use the node's secret (:func:`node_secret`), a 0600 file in the run directory.
* **The handshake** (:class:`ServerHandshake` / :func:`client_handshake`): a challenge-response
  HMAC-SHA256 on every connection, Unix or TCP, before a single framed message is read. The
  secret never crosses the connection; fixed-size messages, so nothing unauthenticated is
  parsed beyond comparing bytes. The host's side has no I/O of its own: the host runs many
  handshakes at once, each with one overall deadline (:mod:`streamstate.spark.host.acceptor`).
* **Session keys** (:func:`session_keys`): HKDF-SHA256 of the secret, salted with both nonces
  and bound to the host id, gives one AES-256-GCM key per direction; every frame after the
  handshake is sealed with them (:mod:`streamstate.spark.wire.channel`).
* **The run directory** (:func:`run_dir`): sockets, locks and logs live in a directory that must
  be the current user's and closed to group and others, below parents that only root or the
  user can change (OpenSSH's safe-path rule); a Unix-socket peer must run as the host's uid
  (:func:`peer_uid`).
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
import time
import uuid
from typing import NamedTuple

__all__ = [
    "MAGIC",
    "PROTOCOL_VERSION",
    "REPLY_BYTES",
    "AuthError",
    "ServerHandshake",
    "SessionKeys",
    "check_parents",
    "check_private_dir",
    "client_handshake",
    "new_secret",
    "node_id",
    "node_secret",
    "peer_uid",
    "run_dir",
    "session_keys",
]

#: version of the host protocol: the handshake, the sealed frames and the messages
#: (:mod:`streamstate.spark.wire.protocol`); both sides' first bytes carry it
PROTOCOL_VERSION = 5
#: the first bytes of both sides of a handshake: "SSHOST", a zero byte, the protocol version
_MAGIC_PREFIX = b"SSHOST\x00"
MAGIC = _MAGIC_PREFIX + bytes([PROTOCOL_VERSION])
_NONCE = 32
_MAC = 32
SECRET_BYTES = 32
#: the bytes of a client's handshake (MAGIC, its nonce, its MAC)
REPLY_BYTES = len(MAGIC) + _NONCE + _MAC
_KEY_INFO = b"streamstate host channel v3\0"


class AuthError(ConnectionError):
    """A handshake failed: the peer does not hold the job's secret (or is not a streamstate
    peer at all, or speaks another protocol version)."""


class SessionKeys(NamedTuple):
    """The AES-256-GCM keys of one connection, as one side sees them."""

    send: bytes
    recv: bytes


def new_secret() -> bytes:
    """A fresh per-run secret."""
    return secrets.token_bytes(SECRET_BYTES)


def _mac(secret: bytes, role: bytes, host: str, first: bytes, second: bytes) -> bytes:
    msg = b"\0".join((role, host.encode(), first, second))
    return hmac.new(secret, msg, hashlib.sha256).digest()


def session_keys(
    secret: bytes, host: str, host_nonce: bytes, client_nonce: bytes, *, client: bool
) -> SessionKeys:
    """The two keys of a connection to host ``host`` (HKDF-SHA256, RFC 5869: the secret as
    input key material, both nonces as salt, the host id in the info), for the client's side
    (``client``) or the host's. Fresh nonces on both sides make every connection's keys new, so
    nothing recorded from another connection opens on this one."""
    from cryptography.hazmat.primitives import hashes
    from cryptography.hazmat.primitives.kdf.hkdf import HKDF

    okm = HKDF(
        algorithm=hashes.SHA256(),
        length=64,
        salt=host_nonce + client_nonce,
        info=_KEY_INFO + host.encode(),
    ).derive(secret)
    to_host, to_client = okm[:32], okm[32:]
    return SessionKeys(to_host, to_client) if client else SessionKeys(to_client, to_host)


def _version_of(first: bytes) -> int | None:
    """The protocol version a peer's first bytes announce (None: not a streamstate peer)."""
    if len(first) > len(_MAGIC_PREFIX) and first.startswith(_MAGIC_PREFIX):
        return first[len(_MAGIC_PREFIX)]
    return None


def _wrong_magic(first: bytes, who: str) -> AuthError:
    version = _version_of(first)
    if version is not None:
        return AuthError(
            f"{who} speaks state-host protocol version {version}, this side {PROTOCOL_VERSION}: "
            "every node and the driver must run the same streamstate"
        )
    return AuthError(f"{who} is not a streamstate peer (first bytes {first[:8].hex()})")


class ServerHandshake:
    """The host's side of one connection's handshake, without I/O (the host drives many at
    once): send :meth:`challenge`, collect the client's :data:`REPLY_BYTES` bytes (refusing
    early on :meth:`check_prefix`), then :meth:`verify` gives the proof to send back and the
    session keys, or raises :class:`AuthError`."""

    __slots__ = ("host", "nonce", "secret")

    def __init__(self, secret: bytes, host: str) -> None:
        self.secret = secret
        self.host = host
        self.nonce = os.urandom(_NONCE)

    def challenge(self) -> bytes:
        return MAGIC + self.nonce

    @staticmethod
    def check_prefix(data: bytes) -> None:
        """Refuse a client whose first bytes already show it is no client of this version."""
        n = min(len(data), len(MAGIC))
        if data[:n] != MAGIC[:n]:
            raise _wrong_magic(data, "the client")

    def verify(self, reply: bytes) -> tuple[bytes, SessionKeys]:
        if len(reply) != REPLY_BYTES:
            raise AuthError(
                f"truncated the client's handshake: {len(reply)} of {REPLY_BYTES} bytes"
            )
        self.check_prefix(reply)
        theirs = reply[len(MAGIC) : len(MAGIC) + _NONCE]
        mac = reply[len(MAGIC) + _NONCE :]
        expected = _mac(self.secret, b"client", self.host, self.nonce, theirs)
        if not hmac.compare_digest(mac, expected):
            raise AuthError("wrong HMAC: the client does not hold this job's secret")
        proof = _mac(self.secret, b"host", self.host, theirs, self.nonce)
        return proof, session_keys(self.secret, self.host, self.nonce, theirs, client=False)


def _read(sock: socket.socket, n: int, what: str, deadline: float) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"no complete {what} within the handshake deadline")
        sock.settimeout(left)
        try:
            chunk = sock.recv(n - len(buf))
        except TimeoutError:
            raise TimeoutError(f"no complete {what} within the handshake deadline") from None
        if not chunk:
            if not buf:
                raise EOFError(f"the peer closed the connection before {what}")
            raise AuthError(f"truncated {what}: {len(buf)} of {n} bytes, then the peer closed")
        buf += chunk
    return bytes(buf)


def client_handshake(
    sock: socket.socket, secret: bytes, host: str, timeout: float = 10.0
) -> SessionKeys:
    """The client's side: proves the secret to host ``host``, checks that it holds it too and
    returns the session keys; the whole exchange has ``timeout`` seconds (``TimeoutError``).
    ``EOFError`` if the peer closed before its challenge (a host going away: try again)."""
    deadline = time.monotonic() + timeout
    challenge = _read(sock, len(MAGIC) + _NONCE, "the host's challenge", deadline)
    if challenge[: len(MAGIC)] != MAGIC:
        raise _wrong_magic(challenge, "the state host")
    theirs = challenge[len(MAGIC) :]
    nonce = os.urandom(_NONCE)
    sock.sendall(MAGIC + nonce + _mac(secret, b"client", host, theirs, nonce))
    try:
        proof = _read(sock, _MAC, "the host's proof", deadline)
    except EOFError as exc:
        raise AuthError(
            f"the state host {host} refused the handshake (another job's secret or another "
            "host id; see its log)"
        ) from exc
    if not hmac.compare_digest(proof, _mac(secret, b"host", host, nonce, theirs)):
        raise AuthError(f"the peer does not prove it is the state host {host} of this job")
    return session_keys(secret, host, theirs, nonce, client=True)


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


def check_parents(path: str) -> None:
    """Raise ``PermissionError`` unless every directory above ``path`` (symlinks resolved) is
    owned by root or the current user and writable by nobody else, as OpenSSH's
    ``safe_path()`` checks a key file's directories: whoever can write a parent can replace the
    run directory with one of their own. A world-writable parent with the sticky bit (``/tmp``)
    is accepted: there only an entry's owner may rename or remove it."""
    uid = os.getuid()
    parent = os.path.dirname(os.path.realpath(path))
    while True:
        st = os.stat(parent)
        mode = stat.S_IMODE(st.st_mode)
        if st.st_uid not in (0, uid):
            raise PermissionError(
                f"{parent}, a parent of the state host run directory {path}, is owned by uid "
                f"{st.st_uid}: that user could replace the run directory; use a directory below "
                "parents owned by root or by you (STREAMSTATE_RUN_DIR)"
            )
        if mode & 0o022 and not (mode & stat.S_ISVTX and st.st_uid == 0):
            raise PermissionError(
                f"{parent}, a parent of the state host run directory {path}, has mode "
                f"{mode:04o}: group/other may write it (and replace the run directory) without "
                "the sticky bit; use another directory (STREAMSTATE_RUN_DIR) or chmod go-w it"
            )
        if parent == os.path.dirname(parent):
            return
        parent = os.path.dirname(parent)


def run_dir(override: str | None = None) -> str:
    """The node's directory of host sockets, locks and logs: ``override``, else
    ``$STREAMSTATE_RUN_DIR``, else ``/tmp/streamstate-<uid>``; created (with any missing
    parent) with mode 0700 after its existing parents passed :func:`check_parents`. An
    existing directory that is not the current user's or is open to group/others, or that lies
    below a parent others may write, is refused (``PermissionError`` naming it) and nothing is
    created."""
    d = override or os.environ.get("STREAMSTATE_RUN_DIR") or f"/tmp/streamstate-{os.getuid()}"
    missing = []
    here = os.path.abspath(d)
    while not os.path.lexists(here) and here != os.path.dirname(here):
        missing.append(here)
        here = os.path.dirname(here)
    if missing:
        # the parents are checked before anything is created below them: a refused run
        # directory leaves nothing behind
        check_parents(missing[-1])
        for directory in reversed(missing):
            with contextlib.suppress(FileExistsError):
                os.mkdir(directory, 0o700)
    check_private_dir(d)
    check_parents(d)
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
