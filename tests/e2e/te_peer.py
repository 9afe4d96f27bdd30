"""One Mooncake Transfer Engine peer, driven over stdin/stdout by tests/e2e/test_transfer_engine.py.

Usage: ``python te_peer.py SEGMENT_NAME METADATA_URL BUFFER_BYTES``

The peer starts a ``mooncake.engine.TransferEngine`` on the TCP transport with
``METADATA_URL`` (``http://host:port/metadata``) as its HTTP metadata server, registers one
buffer of ``BUFFER_BYTES`` (zero-filled memory it owns) and prints one JSON line
``{"ok": true, "segment": ..., "addr": ..., "size": ..., "rpc_port": ...}``; on any failure it
prints ``{"ok": false, "error": ...}`` and exits 1. Then it answers one JSON command per stdin
line with one JSON line on stdout:

- ``{"op": "fill", "offset": o, "data": b64}``: copy bytes into its own buffer;
- ``{"op": "dump", "offset": o, "length": n}``: ``{"ok": true, "data": b64}`` of its own buffer;
- ``{"op": "read", "peer": seg, "peer_addr": a, "offset": o, "length": n}``:
  ``transfer_sync_read`` of n bytes at the peer's address a into its buffer at offset o;
- ``{"op": "write", "peer": seg, "peer_addr": a, "offset": o, "length": n}``:
  ``transfer_sync_write`` of n bytes from its buffer at offset o to the peer's address a;
- ``{"op": "quit"}``: unregister the buffer, destroy the engine (which deletes its metadata
  keys) and exit 0.

Transfer results are ``{"ok": rc == 0, "rc": rc}``. The engine's own logs go to stderr.
"""

from __future__ import annotations

import base64
import ctypes
import gc
import json
import sys
from typing import Any


def _reply(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def _serve(engine: Any, buf: ctypes.Array[ctypes.c_char], base: int) -> None:
    size = len(buf)
    for line in sys.stdin:
        if not line.strip():
            continue
        cmd = json.loads(line)
        op = cmd["op"]
        if op == "quit":
            engine.unregister_memory(base)
            return
        offset = int(cmd.get("offset", 0))
        if op == "fill":
            data = base64.b64decode(cmd["data"])
            if offset < 0 or offset + len(data) > size:
                _reply({"ok": False, "error": "fill outside the buffer"})
                continue
            ctypes.memmove(base + offset, data, len(data))
            _reply({"ok": True})
        elif op == "dump":
            length = int(cmd["length"])
            data = ctypes.string_at(base + offset, length)
            _reply({"ok": True, "data": base64.b64encode(data).decode()})
        elif op in ("read", "write"):
            length = int(cmd["length"])
            call = engine.transfer_sync_read if op == "read" else engine.transfer_sync_write
            rc = call(cmd["peer"], base + offset, int(cmd["peer_addr"]), length)
            _reply({"ok": rc == 0, "rc": rc})
        else:
            _reply({"ok": False, "error": f"unknown op {op!r}"})


def main(argv: list[str]) -> int:
    segment, metadata_url, size = argv[0], argv[1], int(argv[2])
    try:
        from mooncake.engine import TransferEngine
    except ImportError as exc:  # the wheel or libibverbs.so.1 is missing
        _reply({"ok": False, "error": f"import mooncake.engine failed: {exc}"})
        return 1
    engine = TransferEngine()
    rc = engine.initialize(segment, metadata_url, "tcp", "")
    if rc != 0:
        _reply({"ok": False, "error": f"TransferEngine.initialize returned {rc}"})
        return 1
    buf = ctypes.create_string_buffer(size)
    base = ctypes.addressof(buf)
    rc = engine.register_memory(base, size)
    if rc != 0:
        _reply({"ok": False, "error": f"register_memory returned {rc}"})
        return 1
    _reply(
        {
            "ok": True,
            "segment": segment,
            "addr": base,
            "size": size,
            "rpc_port": engine.get_rpc_port(),
        }
    )
    _serve(engine, buf, base)
    del engine  # the destructor removes this peer's metadata keys
    gc.collect()
    _reply({"ok": True, "bye": True})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
