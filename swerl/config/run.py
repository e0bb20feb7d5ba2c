"""The run's name and seed, where its artifacts go (storage) and where it is tracked (MLflow)."""

from __future__ import annotations

from pydantic import Field, field_validator

from swerl.config.base import StrictModel


class RunConfig(StrictModel):
    name: str = Field("local", min_length=1, max_length=100, pattern=r"^[A-Za-z0-9._-]+$")
    """Run name: the MLflow experiment's run name prefix and the Prefect flow-run name."""
    seed: int = Field(0, ge=0, le=2**31 - 1)
    """Global seed; stages derive their own seeds from it."""


class StorageConfig(StrictModel):
    root: str = Field("file://runs/store", min_length=1)
    """Artifact store root URL: file://PATH (relative to the working directory) or s3://BUCKET/PREFIX."""
    s3_endpoint_url: str | None = None
    """S3 endpoint (e.g. http://127.0.0.1:8333); credentials always come from the environment, never config."""
    s3_region: str | None = None
    """S3 region name, if the endpoint needs one."""
    connect_timeout_s: float = Field(10.0, gt=0, le=600)
    """Per-request connect timeout for object storage."""
    read_timeout_s: float = Field(60.0, gt=0, le=3600)
    """Per-request read timeout for object storage."""
    max_attempts: int = Field(5, ge=1, le=50)
    """Retries (total attempts) for a failing object-storage request before it is an InfraError(storage)."""
    max_pool_connections: int = Field(16, ge=1, le=4096)
    """HTTP connection pool size of the S3 client (named here so no library default decides it)."""
    start_outage_tries: int = Field(5, ge=1, le=20)
    """Tries of a stage's first store read (its force-epoch record) while the store is unreachable (an
    InfraError(storage) after max_attempts): a stage restarted during a storage outage of a few seconds (an S3
    server restarting) waits for it instead of dying at its start; 1: no retry."""
    start_outage_first_wait_s: float = Field(0.5, gt=0, le=60)
    """The wait after that read's first failed try; each later wait doubles (0.5 s with 5 tries: 0.5, 1, 2, 4 s)."""

    def start_outage_waits(self) -> tuple[float, ...]:
        """The waits between the tries of a stage's first store read (start_outage_*)."""
        return tuple(self.start_outage_first_wait_s * 2**index for index in range(self.start_outage_tries - 1))

    @field_validator("root")
    @classmethod
    def _known_scheme(cls, v: str) -> str:
        if not (v.startswith("file://") or v.startswith("s3://") or "://" not in v):
            raise ValueError(f"unsupported storage URL {v!r}: use file://PATH or s3://BUCKET/PREFIX")
        return v


class TrackingConfig(StrictModel):
    uri: str = Field("sqlite:///runs/mlflow.db", min_length=1)
    """MLflow tracking URI: a sqlite file by default, or http://HOST:PORT of an `mlflow server`."""
    experiment: str = Field("swerl", min_length=1, max_length=200)
    """MLflow experiment that holds the pipeline's parent runs."""
    registered_model: str | None = Field(None, min_length=1, max_length=200, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
    """Registered model the SFT and GRPO models become versions of; None: RUN_NAME-agent."""
    system_metrics_interval_s: float = Field(10.0, gt=0, le=3600)
    """Seconds between samples of CPU, memory, disk and network into the pipeline's MLflow run (0 is refused)."""
