"""Input-length buckets: endpoints serve ranges of prompt lengths."""

from __future__ import annotations

import itertools
from bisect import bisect_right
from collections.abc import Sequence

from pydantic import Field, field_validator

from services.common.routing.framework import CycleContext
from services.common.routing.registry import Params, PluginEnv, register
from services.common.routing.types import EndpointView, RequestView


class LengthBucketParams(Params):
    # Ascending prompt-token boundaries; N boundaries make N+1 buckets:
    # [0, b0), [b0, b1), ..., [b_{N-1}, inf).
    boundaries: list[int] = Field(min_length=1)
    label: str = "tideserve.io/length-bucket"

    @field_validator("boundaries")
    @classmethod
    def _ascending(cls, v: list[int]) -> list[int]:
        if any(b <= 0 for b in v) or any(a >= b for a, b in itertools.pairwise(v)):
            raise ValueError("boundaries must be positive and strictly ascending")
        return v


@register("length-bucket", LengthBucketParams)
class LengthBucket:
    """Keeps the endpoints assigned to the request's prompt-length bucket. An endpoint's
    bucket is its integer ``label`` value; unlabeled endpoints are spread evenly over the
    buckets by their position in the id-ordered candidate list. If the bucket has no
    endpoint, every candidate is kept (fallback, never empties the set)."""

    def __init__(self, name: str, params: LengthBucketParams, env: PluginEnv) -> None:
        self.name = name
        self.boundaries = list(params.boundaries)
        self.label = params.label
        self.n = len(self.boundaries) + 1

    def bucket_of(self, prompt_tokens: int) -> int:
        return bisect_right(self.boundaries, prompt_tokens)

    def _assign(self, candidates: Sequence[EndpointView]) -> list[int]:
        out: list[int] = []
        for i, e in enumerate(candidates):
            raw = e.labels.get(self.label)
            if raw is not None and raw.isdigit() and int(raw) < self.n:
                out.append(int(raw))
            else:
                out.append(i * self.n // len(candidates))
        return out

    def filter(
        self, ctx: CycleContext, request: RequestView, candidates: Sequence[EndpointView]
    ) -> Sequence[EndpointView]:
        want = self.bucket_of(request.prompt_tokens)
        keep = [e for e, b in zip(candidates, self._assign(candidates), strict=True) if b == want]
        return keep or candidates
