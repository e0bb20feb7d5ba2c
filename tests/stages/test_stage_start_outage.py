"""A stage's first store read waits through a storage outage (swerl.stages.runner.read_force_epoch), by the waits
storage.start_outage_* name (StorageConfig.start_outage_waits)."""

from __future__ import annotations

from pathlib import Path

import pytest

from swerl.config import ConfigError, load_config
from swerl.config.run import StorageConfig
from swerl.errors import InfraError
from swerl.stages import runner
from swerl.stages.runner import read_force_epoch
from swerl.storage import Store


class DownFor(Store):
    """A file store whose first `failures` exists() calls find the storage unreachable."""

    def __init__(self, root: str, failures: int) -> None:
        super().__init__(root)
        self.failures = failures

    def exists(self, rel: str) -> bool:
        if self.failures > 0:
            self.failures -= 1
            raise InfraError("storage", "connection refused")
        return super().exists(rel)


def test_the_waits_are_named_in_the_storage_config_and_bounded() -> None:
    assert StorageConfig().start_outage_waits() == (0.5, 1.0, 2.0, 4.0)  # the former module constant
    cfg = load_config(None, ["storage.start_outage_tries=3", "storage.start_outage_first_wait_s=2"])
    assert cfg.storage.start_outage_waits() == (2.0, 4.0)
    assert load_config(None, ["storage.start_outage_tries=1"]).storage.start_outage_waits() == ()
    for bad in ["storage.start_outage_tries=0", "storage.start_outage_tries=21", "storage.start_outage_first_wait_s=0"]:
        with pytest.raises(ConfigError, match="start_outage"):
            load_config(None, [bad])


def test_the_first_read_waits_through_an_outage_then_gives_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    slept: list[float] = []
    monkeypatch.setattr(runner.time, "sleep", slept.append)
    store = DownFor(f"file://{tmp_path}/store", failures=2)
    assert read_force_epoch(store, "toy", "k", (3.0, 6.0, 12.0)) is None and slept == [3.0, 6.0]
    slept.clear()
    store = DownFor(f"file://{tmp_path}/store", failures=4)
    with pytest.raises(InfraError, match="storage"):
        read_force_epoch(store, "toy", "k", (3.0, 6.0, 12.0))
    assert slept == [3.0, 6.0, 12.0]
    slept.clear()
    store = DownFor(f"file://{tmp_path}/store", failures=5)
    with pytest.raises(InfraError, match="storage"):
        read_force_epoch(store, "toy", "k")  # the config's defaults: 5 tries
    assert slept == [0.5, 1.0, 2.0, 4.0]
