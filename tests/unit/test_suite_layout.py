"""The suite's own layout: pytest imports test modules by their basename (the tiers have no
``__init__.py``), so two test files of one name in different tiers stop collection of the
whole suite ("import file mismatch")."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent


def test_test_module_names_are_unique_across_tiers() -> None:
    names = Counter(p.name for p in TESTS.rglob("test_*.py"))
    assert [n for n, k in names.items() if k > 1] == []
