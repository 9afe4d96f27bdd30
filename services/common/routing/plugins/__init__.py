"""Built-in plugins. Importing this package registers every plugin type."""

from services.common.routing.plugins import (
    affinity,
    buckets,
    cost,
    estimate,
    goodput,
    load,
    pd,
    pd_price,
    pickers,
    placement,
    prefix,
    room,
    sglang,
    tpot,
)

__all__ = [
    "affinity",
    "buckets",
    "cost",
    "estimate",
    "goodput",
    "load",
    "pd",
    "pd_price",
    "pickers",
    "placement",
    "prefix",
    "room",
    "sglang",
    "tpot",
]
