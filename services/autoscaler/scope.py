"""Which stored deployments this autoscaler manages (``managed_deployments``; pure).

Deployment specs live in Postgres, which several stacks may share; an autoscaler plans,
starts, resumes, scales and drains only the deployments its scope admits. The scope is a list
of names or shell-style patterns (``fnmatch``, case-sensitive: ``chat-*``); empty = every
stored deployment (one autoscaler per database, the stack's default). A deployment outside
the scope can still be applied, listed and described through this autoscaler (it is stored
for the one that manages it), but this one never hands it to its reconciler.
"""

from __future__ import annotations

from dataclasses import dataclass
from fnmatch import fnmatchcase

__all__ = ["EVERY", "NotManaged", "Scope"]


class NotManaged(ValueError):
    """An operation that would drive a deployment outside this autoscaler's scope."""


@dataclass(frozen=True)
class Scope:
    patterns: tuple[str, ...] = ()

    def manages(self, name: str) -> bool:
        return not self.patterns or any(fnmatchcase(name, p) for p in self.patterns)

    def check(self, name: str) -> None:
        """:class:`NotManaged` (naming the scope) unless ``name`` is managed here."""
        if not self.manages(name):
            raise NotManaged(
                f"deployment {name!r} is not managed by this autoscaler "
                f"(managed_deployments: {', '.join(self.patterns)})"
            )


EVERY = Scope()
"""The default scope: every stored deployment."""
