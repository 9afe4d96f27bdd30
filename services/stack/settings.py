"""Settings of the local stack itself (section ``stack:`` of the YAML file)."""

from __future__ import annotations

from pydantic import Field

from services.common.settings import ServiceSettings
from services.stack.plan import DEFAULT_REDIS_PORT


class StackSettings(ServiceSettings):
    """Common settings plus what only ``tideserve up`` uses.

    ``postgres_url`` / ``redis_url`` unset → embedded servers under ``state_dir``.
    """

    redis_port: int = Field(DEFAULT_REDIS_PORT, ge=1, le=65535, description="embedded Redis port")
    start_timeout_s: float = Field(
        60.0, gt=0, description="time every child gets to report SERVING"
    )
    stop_timeout_s: float = Field(10.0, gt=0, description="SIGTERM → SIGKILL grace per child")
