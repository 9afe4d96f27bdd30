"""Redis streams carrying protobuf payloads.

- :mod:`.codec`: the entry format (``"t"`` = full protobuf name, ``"p"`` = bytes), stream
  names, dead-letter records (pure);
- :mod:`.ids`: stream entry ids: parse, format, compare, time <-> id (pure);
- :mod:`.producer`: :class:`StreamProducer` (XADD one or many, trimmed) and
  :class:`DeadLetters` (entries a reader gives up on, to ``{stream}:dead``);
- :mod:`.group`: :class:`StreamConsumer`, one member of a consumer group (at-least-once,
  shared work, reclaim, dead letters);
- :mod:`.follower`: :class:`StreamFollower`, a plain-XREAD cursor for readers that each
  need every entry (start position, batches, decode, back-off, clean stop);
- :mod:`.health`: :func:`check_redis`.

Clients must be created with ``decode_responses=False`` (payloads are bytes).
"""

from services.common.streams.codec import (
    DEAD_SUFFIX,
    PayloadError,
    dead_letter,
    dead_letter_stream,
    decode_entry,
    encode_entry,
    stream_entries,
    stream_name,
)
from services.common.streams.follower import (
    FOLLOWER_COUNTERS,
    Start,
    StreamFollower,
    newest_id,
)
from services.common.streams.group import ConsumerStats, StreamConsumer
from services.common.streams.health import check_redis, close_quietly
from services.common.streams.producer import DeadLetters, StreamProducer

__all__ = [
    "DEAD_SUFFIX",
    "FOLLOWER_COUNTERS",
    "ConsumerStats",
    "DeadLetters",
    "PayloadError",
    "Start",
    "StreamConsumer",
    "StreamFollower",
    "StreamProducer",
    "check_redis",
    "close_quietly",
    "dead_letter",
    "dead_letter_stream",
    "decode_entry",
    "encode_entry",
    "newest_id",
    "stream_entries",
    "stream_name",
]
