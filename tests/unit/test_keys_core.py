"""API keys (pure): key format and hashing, what a key permits (tenant, class, salt), the
rate-limit window decision, and the in-process key cache (injected clock: revocation is
seen within the TTL, the store's failures are ridden out with a recent answer)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from services.scheduler.keys.cache import KeyCache, KeysUnavailable
from services.scheduler.keys.model import (
    ApiKey,
    Denied,
    Grant,
    bearer_token,
    check_tenant_name,
    hash_key,
    looks_like_key,
    new_key,
    resolve,
    tenant_salt,
)
from services.scheduler.keys.ratelimit import (
    Allow,
    Lease,
    Limited,
    TooLarge,
    WindowCounts,
    decide,
    lease_size,
    spend,
    window_index,
)
from tests.helpers.keys import FakeKeyStore

CLASSES = ("interactive", "agent", "batch")


def test_new_keys_are_well_formed_distinct_and_hashed() -> None:
    (a, pa), (b, _) = new_key(), new_key()
    assert a != b and looks_like_key(a) and looks_like_key(b)
    assert a.startswith(pa) and pa.startswith("sk-ts-") and len(pa) == 12
    assert hash_key(a) != hash_key(b) and len(hash_key(a)) == 32
    assert hash_key(a) == hash_key(a)


@pytest.mark.parametrize(
    ("header", "token"),
    [
        (None, ""),
        ("", ""),
        ("Bearer sk-ts-x", "sk-ts-x"),
        ("bearer   sk-ts-y ", "sk-ts-y"),
        ("Basic dXNlcjpwdw==", ""),
        ("sk-ts-x", ""),
    ],
    ids=["absent", "empty", "bearer", "case-and-spaces", "basic", "no-scheme"],
)
def test_bearer_token(header: str | None, token: str) -> None:
    assert bearer_token(header) == token


@pytest.mark.parametrize(
    ("key", "ok"),
    [
        ("sk-ts-" + "a" * 43, True),
        ("sk-ts-" + "a" * 42, False),
        ("sk-xx-" + "a" * 43, False),
        ("sk-ts-" + "a" * 42 + "!", False),
    ],
    ids=["good", "short", "other-prefix", "bad-char"],
)
def test_looks_like_key(key: str, ok: bool) -> None:
    assert looks_like_key(key) is ok


@pytest.mark.parametrize(
    ("tenant", "ok"),
    [("acme", True), ("a.b-c_9", True), ("", False), ("a:b", False), ("-a", False)],
    ids=["plain", "punct", "empty", "colon", "leading-dash"],
)
def test_tenant_names(tenant: str, ok: bool) -> None:
    if ok:
        assert check_tenant_name(tenant) == tenant
    else:
        with pytest.raises(ValueError):
            check_tenant_name(tenant)


@pytest.mark.parametrize(
    ("tenant", "salt"),
    [("a", ""), ("a", "b:c"), ("a.b", "c"), ("acme", "acme:")],
    ids=["no-salt", "colon-in-salt", "dot-tenant", "salt-like-a-tenant"],
)
def test_a_salt_names_its_tenant(tenant: str, salt: str) -> None:
    # tenant names have no ':' (check_tenant_name), so the salt maps back to one
    # (tenant, client salt): two tenants can never produce the same salt
    assert tenant_salt(check_tenant_name(tenant), salt).split(":", 1) == [tenant, salt]


KEY = ApiKey("key_1", "sk-ts-abcdef", "acme", slo_classes=("agent", "batch"))
ANY = ApiKey("key_2", "sk-ts-ghijkl", "acme")


@pytest.mark.parametrize(
    ("key", "tenant", "cls", "salt", "want"),
    [
        (KEY, "", "", "", Grant("acme", "agent", "acme:")),
        (KEY, "acme", "batch", "s1", Grant("acme", "batch", "acme:s1")),
        (KEY, "other", "", "", Denied("", "tenant")),
        (KEY, "", "interactive", "", Denied("", "slo_class")),
        (ANY, "", "interactive", "", Grant("acme", "interactive", "acme:")),
        (ANY, "", "", "", Grant("acme", "agent", "acme:")),
        (
            ApiKey("k", "p", "acme", slo_classes=("batch",)),
            "",
            "",
            "",
            Grant("acme", "batch", "acme:"),
        ),
    ],
    ids=[
        "nothing-named",
        "own-tenant-allowed-class",
        "other-tenant-403",
        "class-not-allowed-403",
        "all-classes-key",
        "all-classes-default",
        "default-not-allowed-first-of-key",
    ],
)
def test_resolve(key: ApiKey, tenant: str, cls: str, salt: str, want: Grant | Denied) -> None:
    got = resolve(
        key, tenant=tenant, slo_class=cls, cache_salt=salt, default_class="agent", classes=CLASSES
    )
    if isinstance(want, Denied):
        assert isinstance(got, Denied) and got.param == want.param
    else:
        assert got == want


@pytest.mark.parametrize(
    ("counts", "elapsed", "rpm", "tpm", "cost", "want"),
    [
        (WindowCounts(0, 1, 0, 10), 0.0, 10, 100, 10, Allow()),
        (WindowCounts(0, 10, 0, 100), 0.5, 10, 100, 10, Allow()),
        (WindowCounts(0, 11, 0, 110), 0.5, 10, None, 10, Limited("requests", 10, 36_000)),
        (WindowCounts(10, 5, 0, 0), 0.25, 10, None, 0, Limited("requests", 10, 15_000)),
        (WindowCounts(10, 5, 0, 0), 0.6, 10, None, 0, Allow()),
        (WindowCounts(0, 1, 0, 150), 0.0, None, 100, 50, Limited("tokens", 100, 90_000)),
        (WindowCounts(0, 1, 0, 500), 0.0, 1000, 100, 500, TooLarge(500, 100)),
        (WindowCounts(99, 99, 9_999, 9_999), 0.0, None, None, 1, Allow()),
    ],
    ids=[
        "first",
        "at-limit",
        "over-in-this-window",
        "previous-window-weighs",
        "previous-decayed",
        "tokens",
        "one-request-over-tpm",
        "no-limits",
    ],
)
def test_decide(
    counts: WindowCounts,
    elapsed: float,
    rpm: int | None,
    tpm: int | None,
    cost: int,
    want: Allow | Limited | TooLarge,
) -> None:
    assert decide(counts, elapsed=elapsed, window_ms=60_000, rpm=rpm, tpm=tpm, cost=cost) == want


def rpm10(counts: WindowCounts, elapsed: float) -> Allow | Limited | TooLarge:
    return decide(counts, elapsed=elapsed, window_ms=60_000, rpm=10, tpm=None, cost=0)


def test_retry_after_within_the_window_is_when_the_retry_passes() -> None:
    counts, w = WindowCounts(10, 5, 0, 0), 60_000
    d = rpm10(counts, 0.25)
    assert isinstance(d, Limited)
    at = 0.25 + d.retry_after_ms / w  # the retry is counted again: same counts
    assert rpm10(counts, at) == Allow()
    assert isinstance(rpm10(counts, at - 0.01), Limited)


def test_retry_after_in_the_next_window_is_when_the_retry_passes() -> None:
    w = 60_000
    d = rpm10(WindowCounts(0, 11, 0, 0), 0.5)
    assert isinstance(d, Limited)
    at = 0.5 + d.retry_after_ms / w - 1.0  # into the next window
    # there: this window without the refused request is the previous one; the retry counts
    after = WindowCounts(10, 1, 0, 0)
    assert rpm10(after, at) == Allow()
    assert isinstance(rpm10(after, at - 0.01), Limited)


@pytest.mark.parametrize(
    ("rpm", "tpm", "cost", "size"),
    [
        (600, 100_000, 50, (12, 2000)),
        (10, 100_000, 50, (1, 2000)),
        (600, 1000, 50, (12, 50)),
        (None, 100_000, 50, (40, 2000)),
        (600, None, 50, (12, 600)),
    ],
    ids=["both", "small-rpm-one-request", "small-tpm-this-request", "no-rpm", "no-tpm"],
)
def test_lease_size(rpm: int | None, tpm: int | None, cost: int, size: tuple[int, int]) -> None:
    assert lease_size(rpm, tpm, cost, 0.02) == size


@pytest.mark.parametrize(
    ("lease", "rpm", "tpm", "cost", "left"),
    [
        (Lease(3, 2, 100), 10, 1000, 40, Lease(3, 1, 60)),
        (Lease(3, 0, 100), 10, 1000, 40, None),
        (Lease(3, 2, 30), 10, 1000, 40, None),
        (Lease(3, 0, 100), None, 1000, 40, Lease(3, -1, 60)),
        (Lease(3, 2, 0), 10, None, 40, Lease(3, 1, -40)),
    ],
    ids=["spends", "out-of-requests", "out-of-tokens", "requests-unlimited", "tokens-unlimited"],
)
def test_spend(
    lease: Lease, rpm: int | None, tpm: int | None, cost: int, left: Lease | None
) -> None:
    assert spend(lease, rpm, tpm, cost) == left


def test_a_lease_is_decided_as_one_request_of_its_size() -> None:
    # 90 of 100 used: a lease of 12 does not fit, one request does
    counts = WindowCounts(0, 90 + 12, 0, 0)
    d = decide(counts, elapsed=0.0, window_ms=60_000, rpm=100, tpm=None, cost=0, requests=12)
    assert isinstance(d, Limited)
    one = WindowCounts(0, 91, 0, 0)
    assert decide(one, elapsed=0.0, window_ms=60_000, rpm=100, tpm=None, cost=0) == Allow()


def test_window_index() -> None:
    assert window_index(125_000, 60_000) == (2, 5_000 / 60_000)


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


async def test_cache_revocation_is_seen_within_the_ttl() -> None:
    store, clock = FakeKeyStore(), Clock()
    cache = KeyCache(store.by_hash, ttl_s=5.0, stale_s=60.0, clock=clock)
    d = hash_key("sk-ts-x")
    store.keys[d] = KEY
    assert await cache.get(d) == KEY
    store.keys[d] = replace(KEY, revoked_at=5.0)
    clock.t += 4.9
    assert (await cache.get(d)) == KEY  # within the TTL: the cached answer, no fetch
    assert store.calls == 1
    clock.t += 0.2
    got = await cache.get(d)
    assert got is not None and not got.live  # past the TTL: re-read, revoked
    assert store.calls == 2


async def test_cache_remembers_unknown_keys_for_the_ttl() -> None:
    store, clock = FakeKeyStore(), Clock()
    cache = KeyCache(store.by_hash, ttl_s=5.0, clock=clock)
    d = hash_key("sk-ts-new")
    assert await cache.get(d) is None
    store.keys[d] = KEY  # created after a miss: usable once the miss expires
    assert await cache.get(d) is None
    clock.t += 5.0
    assert await cache.get(d) == KEY
    assert store.calls == 2


async def test_cache_rides_out_store_failures_with_a_recent_answer() -> None:
    store, clock = FakeKeyStore(), Clock()
    cache = KeyCache(store.by_hash, ttl_s=5.0, stale_s=60.0, clock=clock)
    d, other = hash_key("sk-ts-a"), hash_key("sk-ts-b")
    store.keys[d] = KEY
    await cache.get(d)
    store.fail = True
    clock.t += 30.0
    assert await cache.get(d) == KEY  # stale but within stale_s
    with pytest.raises(KeysUnavailable):
        await cache.get(other)  # never seen: nothing to serve
    clock.t += 31.0
    with pytest.raises(KeysUnavailable):
        await cache.get(d)  # too old now


async def test_cache_concurrent_misses_share_one_fetch() -> None:
    store = FakeKeyStore()
    store.gate = asyncio.Event()
    cache = KeyCache(store.by_hash, ttl_s=5.0)
    d = hash_key("sk-ts-a")
    store.keys[d] = KEY
    tasks = [asyncio.create_task(cache.get(d)) for _ in range(5)]
    await asyncio.sleep(0)
    store.gate.set()
    assert await asyncio.gather(*tasks) == [KEY] * 5
    assert store.calls == 1
