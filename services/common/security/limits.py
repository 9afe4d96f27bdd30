"""Bounded list lengths in gRPC requests (pure).

Rule: every repeated field of a request message, at any depth, holds at most its bound:
``list_lengths[<full field name>]`` when given, else ``max_list_length``. Map fields count
as lists of entries. :func:`overlong_field` finds the first field over its bound in one
walk over the set fields; the interceptor answers INVALID_ARGUMENT naming it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message

__all__ = ["ListBounds", "Overlong", "overlong_field"]

_MESSAGE = FieldDescriptor.TYPE_MESSAGE


@dataclass(frozen=True)
class ListBounds:
    default: int
    per_field: Mapping[str, int]

    def of(self, field: FieldDescriptor) -> int:
        return self.per_field.get(field.full_name, self.default)


@dataclass(frozen=True)
class Overlong:
    path: str
    """Where, from the request down: ``batches[3].events``."""
    field: str
    """The field's full name: ``tideserve.v1.KVEventBatch.events``."""
    length: int
    bound: int

    def message(self) -> str:
        return (
            f"{self.path} has {self.length} entries; at most {self.bound} are accepted "
            f"(grpc_limits.list_lengths['{self.field}'] or grpc_limits.max_list_length)"
        )


def overlong_field(msg: Message, bounds: ListBounds, path: str = "") -> Overlong | None:
    """The first repeated field of ``msg`` (depth first) longer than its bound, or None."""
    for field, value in msg.ListFields():
        where = f"{path}.{field.name}" if path else field.name
        if field.is_repeated:
            bound = bounds.of(field)
            if len(value) > bound:
                return Overlong(where, field.full_name, len(value), bound)
            if field.type != _MESSAGE:
                continue
            entry = field.message_type
            if entry is not None and entry.GetOptions().map_entry:
                value_field = entry.fields_by_name["value"]
                if value_field.type != _MESSAGE:
                    continue
                for key, item in value.items():
                    found = overlong_field(item, bounds, f"{where}[{key!r}]")
                    if found is not None:
                        return found
                continue
            for i, item in enumerate(value):
                found = overlong_field(item, bounds, f"{where}[{i}]")
                if found is not None:
                    return found
        elif field.type == _MESSAGE:
            found = overlong_field(value, bounds, where)
            if found is not None:
                return found
    return None
