"""What a run never reads: `swerl serve`'s schedule and `swerl up`'s local service ports."""

from __future__ import annotations

import re
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator

from swerl.config.base import StrictModel

CRON_FIELD = re.compile(r"^(\*|\d+(-\d+)?)(/\d+)?(,(\*|\d+(-\d+)?)(/\d+)?)*$|^[A-Za-z]{3}(-[A-Za-z]{3})?$")


class ServeConfig(StrictModel):
    eval_cron: str = Field("0 3 * * *", min_length=9)
    """Cron schedule (5 fields) of the evaluation deployment registered by `swerl serve`."""
    timezone: str = "UTC"
    """IANA time zone of the cron schedule."""

    @field_validator("eval_cron")
    @classmethod
    def _five_cron_fields(cls, v: str) -> str:
        fields = v.split()
        if len(fields) != 5 or not all(CRON_FIELD.match(f) for f in fields):
            raise ValueError(f"{v!r} is not a 5-field cron expression (minute hour day month weekday)")
        return v

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, v: str) -> str:
        try:
            ZoneInfo(v)
        except (ZoneInfoNotFoundError, ValueError) as exc:
            raise ValueError(f"unknown time zone {v!r}") from exc
        return v

    max_concurrent_runs: int = Field(1, ge=1, le=1000)
    """Flow runs executed at once: by `swerl up`'s Prefect worker (its work pool's concurrency limit) and by a
    foreground `swerl serve` (the Prefect runner's limit)."""


class ServicesConfig(StrictModel):
    """Ports of the local services that `swerl up` starts, all on `host`."""

    host: str = "127.0.0.1"
    """Bind address of every local service (loopback unless you mean otherwise)."""
    prefect_port: int = Field(4200, ge=1024, le=65535)
    """Prefect server (API and UI)."""
    mlflow_port: int = Field(5000, ge=1024, le=65535)
    """MLflow tracking server and UI."""
    s3_port: int = Field(8333, ge=1024, le=65535)
    """SeaweedFS S3 endpoint."""
    seaweed_master_port: int = Field(9333, ge=1024, le=65535)
    """SeaweedFS master."""
    seaweed_volume_port: int = Field(8080, ge=1024, le=65535)
    """SeaweedFS volume server."""
    seaweed_filer_port: int = Field(8888, ge=1024, le=65535)
    """SeaweedFS filer."""
    startup_timeout_s: float = Field(120.0, gt=0, le=3600)
    """How long each service may take to become healthy."""
