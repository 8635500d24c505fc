"""The worker protocol's frames, both directions, over the worker's stdin/stdout:
    frame = b"QBW1" + uint32_be(len(header)) + uint64_be(len(payload)) + header + payload
The header is UTF-8 JSON; tensors travel raw in the payload and the header locates
them with {"offset", "nbytes"}, or in a read-only store file on the worker's own
filesystem named by the run's "store" (or a fixture's "file"). Requests:
{"type": "fingerprint", ...}, {"type": "run", ...}, {"type": "fork", ...}, {"type": "end"}; answers end with
{"type": "done"}, and a failure is an "error" frame (JobError: its stage, fixture and folder)."""

from __future__ import annotations

import json
import struct




PROTOCOL = 1


MAGIC = b"QBW1"


_HEAD = struct.Struct(">4sIQ")


def write_frame(stream, header: dict, payload=b"", flush: bool = True) -> None:
    head = json.dumps(header, sort_keys=True, separators=(",", ":")).encode("utf-8")
    if isinstance(payload, (list, tuple)):
        size = sum(len(p) for p in payload)
        stream.write(_HEAD.pack(MAGIC, len(head), size) + head)
        for part in payload:
            stream.write(part)
    else:
        stream.write(_HEAD.pack(MAGIC, len(head), len(payload)) + head)
        if payload:
            stream.write(payload)
    if flush:
        stream.flush()


def _read_exact(stream, n: int) -> bytes:
    chunks = []
    while n > 0:
        block = stream.read(n)
        if not block:
            raise EOFError("stream ended inside a frame")
        chunks.append(block)
        n -= len(block)
    return b"".join(chunks)


def read_frame(stream):
    """(header, payload) or None at a clean end of stream."""
    first = stream.read(_HEAD.size)
    if not first:
        return None
    if len(first) < _HEAD.size:
        first += _read_exact(stream, _HEAD.size - len(first))
    magic, hlen, plen = _HEAD.unpack(first)
    if magic != MAGIC:
        raise ValueError("not a quantbench worker frame (magic %r)" % (magic,))
    header = json.loads(_read_exact(stream, hlen).decode("utf-8"))
    payload = _read_exact(stream, plen) if plen else b""
    return header, payload


class JobError(Exception):
    """A job's failure, by stage; `folder`: for stage "disk", the folder whose file system is full."""

    def __init__(self, stage, message, fixture_id=None, folder=None):
        Exception.__init__(self, message)
        self.stage = stage
        self.fixture_id = fixture_id
        self.folder = folder
