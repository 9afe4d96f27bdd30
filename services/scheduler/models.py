"""Tables of the scheduler schema (typed SQLAlchemy 2 models; migrations in ./migrations).

None at present: the scheduler keeps no durable state. Drain is per replica and in memory
(gRPC ``Drain``/``Undrain`` on one replica; the autoscaler's ``DRAINING`` membership events
reach every replica through ``{prefix}:membership``); revision 0002 dropped the unused
``drain_state`` table.
"""

from __future__ import annotations

from sqlalchemy import MetaData
from sqlalchemy.orm import DeclarativeBase

SCHEMA = "scheduler"


class Base(DeclarativeBase):
    metadata = MetaData(schema=SCHEMA)
