"""docs/reference/ is generated from the settings classes and the .proto comments
(scripts/gen_docs.py): a checked-in page that no longer matches the code fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from scripts import gen_docs


@pytest.fixture(scope="module")
def pages() -> dict[Path, str]:
    return gen_docs.render()


def test_checked_in_reference_pages_are_current(pages: dict[Path, str]) -> None:
    stale = [str(p.relative_to(gen_docs.ROOT)) for p in gen_docs.stale(pages)]
    assert not stale, f"stale generated docs {stale}: run python scripts/gen_docs.py"


@pytest.mark.parametrize(
    ("page", "expected"),
    [
        # a settings field with its default and environment variable
        ("configuration.md", "`TIDESERVE_SCHEDULER__HTTP_PORT`"),
        ("configuration.md", "| `http_port` | `int` | `8000` |"),
        # a nested model gets its own table
        ("configuration.md", "### `TlsSettings`"),
        # a machine-dependent default is written the same everywhere
        ("configuration.md", "`~/.local/share/tideserve`"),
        # a service, a method with its comment, a message field with its comment
        ("grpc-api.md", "### service `tideserve.v1.SchedulerService`"),
        ("grpc-api.md", "| `Pick` | `PickRequest` → `PickResponse` | Chooses the endpoint(s)"),
        ("grpc-api.md", "`stream PickRequest` → `stream PickResponse`"),
        ("grpc-api.md", "| `prompt_token_ids` = 2 | `repeated uint32` | Token ids of the prompt"),
    ],
    ids=["env-var", "default", "nested", "home-dir", "service", "method", "streaming", "field"],
)
def test_pages_carry_what_the_code_says(pages: dict[Path, str], page: str, expected: str) -> None:
    assert expected in pages[gen_docs.REFERENCE / page]


def test_stale_detects_a_changed_page(tmp_path: Path) -> None:
    page = tmp_path / "x.md"
    page.write_text("old\n", encoding="utf-8")
    assert gen_docs.stale({page: "new\n"}) == [page]
    assert gen_docs.stale({page: "old\n"}) == []
    assert gen_docs.stale({tmp_path / "missing.md": "x"}) == [tmp_path / "missing.md"]
