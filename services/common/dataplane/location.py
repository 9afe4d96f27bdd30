"""Where a request's KV blocks are (pure): what a prefill instance tells a decode instance,
in SGLang's bootstrap answer (``"kv"``) and in vLLM's ``kv_transfer_params``
(``"tideserve_kv"``).

JSON: ``{"segment": "host:port", "block_bytes": n, "addrs": [a0, a1, ...]}``: the Transfer
Engine segment that holds them, the bytes of one block, and the address of each full prompt
block in order (block ``i`` of the prompt at ``addrs[i]``; fewer addresses than prompt blocks
when the tail is not resident).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

__all__ = ["KVLocation"]


@dataclass(frozen=True)
class KVLocation:
    segment: str
    block_bytes: int
    addrs: tuple[int, ...]

    def to_json(self) -> dict[str, Any]:
        return {"segment": self.segment, "block_bytes": self.block_bytes, "addrs": list(self.addrs)}

    @classmethod
    def from_json(cls, obj: Any) -> KVLocation:
        """Parse; ValueError saying what is wrong."""
        if not isinstance(obj, dict):
            raise ValueError("must be an object")
        segment, size, addrs = obj.get("segment"), obj.get("block_bytes"), obj.get("addrs")
        if not isinstance(segment, str) or ":" not in segment:
            raise ValueError("'segment' must be a host:port string")
        if not isinstance(size, int) or isinstance(size, bool) or size <= 0:
            raise ValueError("'block_bytes' must be a positive integer")
        if not isinstance(addrs, list) or not all(
            isinstance(a, int) and not isinstance(a, bool) and a > 0 for a in addrs
        ):
            raise ValueError("'addrs' must be a list of positive integers")
        return cls(segment, size, tuple(addrs))
