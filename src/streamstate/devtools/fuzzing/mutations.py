"""How the fuzzer changes a real file: bytes, values of its decoded structure, and seals.

Three kinds of mutation, each seeded by the run's :class:`random.Random`:

* **bytes** (:func:`mutate_bytes`): flips, interesting values written over lengths and counts
  (both byte orders), insertions, deletions, duplicated and spliced runs, truncation;
* **values** (:func:`mutate_tree`): the file's msgpack or JSON structure is decoded, one value
  somewhere in it is replaced (a traversal name for a string, an extreme for an integer, another
  type, a list emptied or grown), and encoded again; ``bytes`` values that are msgpack
  themselves (a ``JobSpec`` inside BEGIN) are entered too;
* **seals** (``reseal_*``): the checksums of a file format are computed again after a mutation,
  as whoever writes the storage can, so that the mutation reaches the decoder behind them
  instead of stopping at the first checksum.
"""

from __future__ import annotations

import json
import random
import struct
from collections.abc import Callable
from typing import Any

import msgspec

from streamstate.format.codec import compress, crc32c, decompress

__all__ = [
    "ESCAPING_NAMES",
    "mutate_bytes",
    "mutate_json",
    "mutate_msgpack",
    "mutate_tree",
    "reseal_keyed",
    "reseal_manifest",
    "reseal_operator",
    "restructure_keyed",
    "restructure_operator",
]

#: names a checkpoint writer would give to leave the checkpoint
ESCAPING_NAMES = (
    "../../../../../../tmp/streamstate-fuzz-escape",
    "/tmp/streamstate-fuzz-escape",
    "../shared/../../escape",
    "shared/../../../escape",
    "op/../../../escape",
    "a\x00b",
    "..",
    ".",
    "",
    "x" * 5000,
)
_INTS = (
    0,
    1,
    -1,
    2,
    127,
    128,
    255,
    256,
    65535,
    65536,
    2**31 - 1,
    2**31,
    2**32 - 1,
    2**32,
    2**63 - 1,
    -(2**63),
    2**64 - 1,
)
_U32 = (0, 1, 0x7F, 0x80, 0xFF, 0xFFFF, 0x7FFFFFFF, 0x80000000, 0xFFFFFFFF)


# ---- bytes --------------------------------------------------------------------------------------


def mutate_bytes(data: bytes, rng: random.Random, other: bytes = b"") -> bytes:
    """One to four byte-level changes of ``data`` (``other``: a second real file to splice
    from)."""
    buf = bytearray(data)
    for _ in range(rng.choice((1, 1, 1, 2, 4))):
        op = rng.randrange(9)
        n = len(buf)
        if n == 0:
            buf += bytes(rng.randrange(256) for _ in range(rng.randrange(1, 16)))
            continue
        i = rng.randrange(n)
        if op == 0:
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1:
            buf[i] = rng.choice((0, 0xFF, 0x7F, 0x80, 0xC0, 0xC1, 0xDD, 0xDF, rng.randrange(256)))
        elif op == 2 and n >= 4:
            i = rng.randrange(n - 3)
            order = rng.choice((">I", "<I"))
            value = rng.choice((*_U32, n, n + 1, n * 2, rng.randrange(2**32)))
            struct.pack_into(order, buf, i, value)
        elif op == 3:
            buf[i:i] = bytes(rng.randrange(256) for _ in range(rng.randrange(1, 9)))
        elif op == 4:
            del buf[i : i + rng.randrange(1, 17)]
        elif op == 5:
            j = min(n, i + rng.randrange(1, 65))
            buf[i:i] = buf[i:j]
        elif op == 6:
            del buf[rng.randrange(n) :]
        elif op == 7 and other:
            j = rng.randrange(len(other))
            piece = other[j : j + rng.randrange(1, 257)]
            buf[i : i + len(piece)] = piece
        else:
            buf[i] = (buf[i] + rng.choice((1, -1, 16, -16))) % 256
    return bytes(buf)


# ---- values -------------------------------------------------------------------------------------


def _paths(value: Any, path: tuple[Any, ...], out: list[tuple[Any, ...]], limit: int) -> None:
    if len(out) >= limit:
        return
    out.append(path)
    if isinstance(value, dict):
        for k in list(value)[:64]:
            _paths(value[k], (*path, k), out, limit)
    elif isinstance(value, list):
        for i in range(min(len(value), 64)):
            _paths(value[i], (*path, i), out, limit)


def _replacement(value: Any, rng: random.Random) -> Any:
    pick = rng.random()
    if isinstance(value, bool) or value is None:
        return rng.choice((not value, 0, 1, "x", None, [], {}))
    if isinstance(value, int):
        if pick < 0.7:
            return rng.choice((*_INTS, value + 1, value - 1, -value, value * 1000))
        return rng.choice(("1", 1.5, None, [value], True))
    if isinstance(value, float):
        return rng.choice((float("nan"), float("inf"), -0.0, 1e308, int(value), "x"))
    if isinstance(value, str):
        if pick < 0.5:
            return rng.choice(ESCAPING_NAMES)
        if pick < 0.8:
            return rng.choice(("", value + "x", value[:-1], value * 3, "restored", "pickle"))
        return rng.choice((0, None, [value], {"type": value}, value.encode()))
    if isinstance(value, bytes):
        return rng.choice((b"", value[:-1], value + b"\x00", value * 2, "s", None))
    if isinstance(value, list):
        if not value:
            return rng.choice(([0], [None], [[]], [{}], {}, None))
        op = rng.randrange(6)
        if op == 0:
            return []
        if op == 1:
            return value + value
        if op == 2:
            return value[1:]
        if op == 3:
            return [*value, rng.choice(value)]
        if op == 4:
            return list(reversed(value))
        return rng.choice((None, {}, "x", len(value)))
    if isinstance(value, dict):
        if value and rng.random() < 0.5:
            out = dict(value)
            del out[rng.choice(list(out))]
            return out
        return rng.choice(({**value, "extra": 1}, {}, [], None))
    return None


def _set(root: Any, path: tuple[Any, ...], value: Any) -> Any:
    if not path:
        return value
    parent = root
    for key in path[:-1]:
        parent = parent[key]
    parent[path[-1]] = value
    return root


def _get(root: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        root = root[key]
    return root


def mutate_tree(
    tree: Any, rng: random.Random, nested: Callable[[bytes, random.Random], bytes] | None = None
) -> Any:
    """``tree`` (plain lists, dicts and scalars) with one value replaced; ``nested`` mutates a
    ``bytes`` value that holds an encoded structure of its own."""
    paths: list[tuple[Any, ...]] = []
    _paths(tree, (), paths, 4000)
    path = rng.choice(paths)
    current = _get(tree, path)
    if isinstance(current, bytes) and nested is not None and rng.random() < 0.7:
        return _set(tree, path, nested(current, rng))
    return _set(tree, path, _replacement(current, rng))


def mutate_msgpack(data: bytes, rng: random.Random) -> bytes:
    """``data`` decoded as msgpack, one value mutated, encoded again (bytes if undecodable)."""
    try:
        tree = msgspec.msgpack.decode(data)
    except (msgspec.DecodeError, UnicodeDecodeError, RecursionError):
        return mutate_bytes(data, rng)
    return msgspec.msgpack.encode(mutate_tree(_plain(tree), rng, mutate_msgpack))


def mutate_json(data: bytes, rng: random.Random) -> bytes:
    try:
        tree = json.loads(data)
    except (ValueError, RecursionError):
        return mutate_bytes(data, rng)
    return json.dumps(mutate_tree(tree, rng, None), default=_text).encode()


def _text(value: Any) -> str:
    return value.decode("latin-1") if isinstance(value, bytes) else repr(value)


def _plain(value: Any) -> Any:
    """msgpack's decoded tuples as lists (so that they can be changed in place)."""
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


# ---- seals --------------------------------------------------------------------------------------

_PREFIX = struct.Struct(">4sHI")
_U32BE = struct.Struct(">I")
_FRAME = struct.Struct(">III")
_TRAILER = struct.Struct(">II4s")


def _reseal_ends(buf: bytearray) -> tuple[int, int] | None:
    """Seal the header and the footer of an SSKS/SSOS file again; ``(data start, footer
    start)`` or None when the frame is too broken to find them."""
    if len(buf) < _PREFIX.size + 4 + _TRAILER.size:
        return None
    _, _, header_len = _PREFIX.unpack_from(buf)
    data_start = _PREFIX.size + header_len + 4
    if data_start > len(buf):
        return None
    _U32BE.pack_into(buf, data_start - 4, crc32c(bytes(buf[_PREFIX.size : data_start - 4])))
    _, footer_len, _ = _TRAILER.unpack_from(buf, len(buf) - _TRAILER.size)
    footer_start = len(buf) - _TRAILER.size - footer_len
    if footer_start < data_start:
        return None
    footer = bytes(buf[footer_start : len(buf) - _TRAILER.size])
    struct.pack_into(">I", buf, len(buf) - _TRAILER.size, crc32c(footer))
    return data_start, footer_start


def reseal_keyed(data: bytes) -> bytes:
    """An SSKS file with its header, block and footer checksums computed again."""
    buf = bytearray(data)
    ends = _reseal_ends(buf)
    if ends is None:
        return data
    pos, footer_start = ends
    while pos + _FRAME.size + 4 <= footer_start:
        _, _, stored = _FRAME.unpack_from(buf, pos)
        end = pos + _FRAME.size + stored
        if end + 4 > footer_start:
            break
        _U32BE.pack_into(buf, end, crc32c(bytes(buf[pos:end])))
        pos = end + 4
    return bytes(buf)


def reseal_operator(data: bytes) -> bytes:
    """An SSOS file with its header, state and footer checksums computed again."""
    buf = bytearray(data)
    ends = _reseal_ends(buf)
    if ends is None:
        return data
    _, footer_start = ends
    try:
        index = msgspec.msgpack.decode(bytes(buf[footer_start : len(buf) - _TRAILER.size]))
        for entry in index["states"]:
            off, length = int(entry["offset"]), int(entry["length"])
            if off >= 0 and off + length + 4 <= footer_start:
                _U32BE.pack_into(buf, off + length, crc32c(bytes(buf[off : off + length])))
    except Exception:
        pass
    return bytes(buf)


def reseal_manifest(data: bytes) -> bytes:
    """A RocksDB manifest with its body checksum computed again."""
    if len(data) < 10:
        return data
    return data[:6] + _U32BE.pack(crc32c(data[10:])) + data[10:]


# ---- structure ----------------------------------------------------------------------------------


def restructure_keyed(data: bytes, rng: random.Random) -> bytes:
    """An SSKS file with one value of its header, its key-group index or one block's payload
    mutated (the block compressed again with the file's codec), every offset, length and
    checksum made consistent again: what a careful writer of a hostile file would produce."""
    try:
        _, version, header_len = _PREFIX.unpack_from(data)
        header = _plain(msgspec.msgpack.decode(data[_PREFIX.size : _PREFIX.size + header_len]))
        data_start = _PREFIX.size + header_len + 4
        _, footer_len, magic = _TRAILER.unpack_from(data, len(data) - _TRAILER.size)
        footer_start = len(data) - _TRAILER.size - footer_len
        footer = _plain(msgspec.msgpack.decode(data[footer_start : len(data) - _TRAILER.size]))
        codec = header["compression"]
        blocks = []
        pos = data_start
        while pos < footer_start:
            kg, raw, stored = _FRAME.unpack_from(data, pos)
            payload = decompress(codec, data[pos + 12 : pos + 12 + stored], raw)
            blocks.append([kg, payload])
            pos += 12 + stored + 4
    except Exception:
        return mutate_bytes(data, rng)
    target = rng.random()
    if target < 0.15 or not blocks:
        header = mutate_tree(header, rng, mutate_msgpack)
    elif target < 0.3:
        footer = mutate_tree(footer, rng, mutate_msgpack)
    else:
        block = rng.choice(blocks)
        block[1] = mutate_msgpack(block[1], rng)
    head = msgspec.msgpack.encode(header)
    out = bytearray(_PREFIX.pack(b"SSKS", version, len(head)) + head + _U32BE.pack(crc32c(head)))
    offsets = {}
    for kg, payload in blocks:
        try:
            stored_bytes = compress(codec, payload)
        except ValueError:
            stored_bytes = payload
        frame = _FRAME.pack(kg & 0xFFFFFFFF, len(payload), len(stored_bytes))
        offsets[kg] = (len(out), len(frame) + len(stored_bytes) + 4)
        out += frame + stored_bytes + _U32BE.pack(crc32c(frame + stored_bytes))
    if target >= 0.3 and isinstance(footer, dict):
        first = footer.get("first_key_group")
        if isinstance(first, int) and isinstance(footer.get("offsets"), list):
            for kg, (off, size) in offsets.items():
                i = kg - first
                if 0 <= i < len(footer["offsets"]) and i < len(footer.get("sizes", [])):
                    footer["offsets"][i] = off
                    footer["sizes"][i] = size
    tail = msgspec.msgpack.encode(footer)
    out += tail + _TRAILER.pack(crc32c(tail), len(tail), magic)
    return bytes(out)


def restructure_operator(data: bytes, rng: random.Random) -> bytes:
    """An SSOS file with one value of its header or index, or one element, mutated; offsets and
    checksums made consistent again."""
    try:
        _, version, header_len = _PREFIX.unpack_from(data)
        header = _plain(msgspec.msgpack.decode(data[_PREFIX.size : _PREFIX.size + header_len]))
        _, footer_len, magic = _TRAILER.unpack_from(data, len(data) - _TRAILER.size)
        footer_start = len(data) - _TRAILER.size - footer_len
        footer = _plain(msgspec.msgpack.decode(data[footer_start : len(data) - _TRAILER.size]))
        states = []
        for entry in footer["states"]:
            off, length, rel = entry["offset"], entry["length"], entry["element_offsets"]
            blob = data[off : off + length]
            ends = [*rel[1:], length]
            states.append([blob[rel[j] : ends[j]] for j in range(len(rel))])
    except Exception:
        return mutate_bytes(data, rng)
    target = rng.random()
    if target < 0.3:
        header = mutate_tree(header, rng, mutate_msgpack)
    elif target < 0.5 or not any(states):
        footer = mutate_tree(footer, rng, mutate_msgpack)
    else:
        items = rng.choice([s for s in states if s])
        j = rng.randrange(len(items))
        items[j] = mutate_msgpack(items[j], rng)
    head = msgspec.msgpack.encode(header)
    out = bytearray(_PREFIX.pack(b"SSOS", version, len(head)) + head + _U32BE.pack(crc32c(head)))
    entries = footer.get("states") if isinstance(footer, dict) else None
    for i, items in enumerate(states):
        blob = b"".join(items)
        rel, pos = [], 0
        for item in items:
            rel.append(pos)
            pos += len(item)
        if (
            target >= 0.5
            and isinstance(entries, list)
            and i < len(entries)
            and isinstance(entries[i], dict)
        ):
            entries[i].update(offset=len(out), length=len(blob), element_offsets=rel)
        out += blob + _U32BE.pack(crc32c(blob))
    tail = msgspec.msgpack.encode(footer)
    out += tail + _TRAILER.pack(crc32c(tail), len(tail), magic)
    return bytes(out)
