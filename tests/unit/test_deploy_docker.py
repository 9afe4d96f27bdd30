"""deploy/docker/Dockerfile: hadolint-clean, OCI labels, non-root, version in step with the
package; and hadolint really rejects a broken copy."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest

from tests.helpers.deploy import DOCKERFILE, REPO, hadolint_errors

OCI_LABELS = ("title", "description", "version", "revision", "licenses", "source")


def _stages(text: str) -> dict[str, str]:
    """Stage name -> its lines (the part of the Dockerfile from its FROM to the next)."""
    parts = re.split(r"(?m)^FROM ", text)[1:]
    return {p.split("\n", 1)[0].split(" AS ")[-1].strip(): p for p in parts}


def test_dockerfile_is_hadolint_clean() -> None:
    assert hadolint_errors(DOCKERFILE) == []


def test_runtime_stage_has_oci_labels_and_runs_as_non_root() -> None:
    stages = _stages(DOCKERFILE.read_text(encoding="utf-8"))
    assert {"build", "runtime", "transfer"} <= set(stages)
    runtime = stages["runtime"]
    missing = [k for k in OCI_LABELS if f"org.opencontainers.image.{k}=" not in runtime]
    assert missing == []
    for name in ("runtime", "transfer"):
        users = re.findall(r"(?m)^USER (\S+)", stages[name])
        assert users and users[-1].split(":")[0] not in ("0", "root"), name
    assert "HEALTHCHECK" in runtime and "tideserve" in runtime.split("HEALTHCHECK", 1)[1]
    assert not re.search(r"(?m)^RUN .*apt-get", runtime), "no build tools in the final stage"


def test_image_version_is_the_package_version() -> None:
    version = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"][
        "version"
    ]
    match = re.search(r"(?m)^ARG VERSION=(\S+)", DOCKERFILE.read_text(encoding="utf-8"))
    assert match is not None and match.group(1) == version


@pytest.mark.parametrize(
    ("old", "new", "rule"),
    [
        ("USER 10001:10001\nWORKDIR", "USER root\nWORKDIR", "DL3002"),
        ('"tideserve==${VERSION}"', "tideserve", "DL3013"),
        ("--no-install-recommends ", "", "DL3015"),
    ],
    ids=["last-user-root", "unpinned-pip", "apt-recommends"],
)
def test_hadolint_rejects_a_broken_copy(tmp_path: Path, old: str, new: str, rule: str) -> None:
    text = DOCKERFILE.read_text(encoding="utf-8")
    assert old in text
    broken = tmp_path / "Dockerfile"
    broken.write_text(text.replace(old, new, 1), encoding="utf-8")
    errors = hadolint_errors(broken)
    assert any(rule in e for e in errors), errors
