"""Artifact store over fsspec: file:// by default, s3:// through s3fs.

Writes are atomic: an object is visible under its final name only once complete. On a local file system the
bytes go to a temporary sibling that is renamed into place; on S3 a single PUT or a completed multipart upload
is all-or-nothing, so the store uploads only fully written local files and never streams into the final key.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TypeVar

import fsspec

from swerl.errors import InfraError

T = TypeVar("T")


class CorruptStoreFile(ValueError):
    """A store object that exists but cannot be read as what it should be (truncated, not JSON, wrong shape)."""

    def __init__(self, uri: str, reason: str) -> None:
        self.uri = uri
        self.reason = reason
        super().__init__(f"damaged store file {uri}: {reason}")


class DamagedArtifact(CorruptStoreFile):
    """A published artifact whose bytes are not the ones its manifest records (truncated, overwritten): the message
    names the file, the stage that wrote it and the command that recomputes it."""

    def __init__(self, uri: str, found: str, stage: str, manifest_uri: str) -> None:
        self.stage = stage
        super().__init__(
            uri,
            f"{found}; written by stage {stage} (manifest {manifest_uri}); recompute it with "
            f"`swerl run CONFIG --force {stage}`",
        )


def artifact_mismatch(data: bytes | Path, sha256: str, size: int) -> str | None:
    """How bytes (or a local file) differ from what a manifest records (size first, then sha256); None if equal."""
    actual_size = data.stat().st_size if isinstance(data, Path) else len(data)
    if actual_size != size:
        return f"{actual_size} bytes where its manifest records {size}"
    digest = sha256_file(data) if isinstance(data, Path) else hashlib.sha256(data).hexdigest()
    if digest != sha256:
        return f"sha256 {digest[:16]}... where its manifest records {sha256[:16]}..."
    return None


class StoreFileMissing(FileNotFoundError):
    """A store object that is not there; the message names its URI."""

    def __init__(self, uri: str) -> None:
        self.uri = uri
        super().__init__(f"store file {uri} does not exist")


@dataclass(frozen=True)
class Artifact:
    """One stored object: where it is and what it holds."""

    name: str
    uri: str
    sha256: str
    size: int

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            digest.update(block)
    return digest.hexdigest()


class Store:
    """An artifact store rooted at a URL; paths given to it are relative to that root."""

    def __init__(self, root: str, storage_options: dict[str, Any] | None = None) -> None:
        if "://" not in root:
            root = "file://" + root
        self.protocol, rest = root.split("://", 1)
        if self.protocol == "file":
            rest = str(Path(rest).expanduser().resolve())
        elif self.protocol != "s3":
            raise ValueError(f"unsupported storage protocol {self.protocol!r} in {root!r}")
        self.root = rest.rstrip("/")
        self.fs = fsspec.filesystem(self.protocol, **(storage_options or {}))
        if self.protocol == "file":
            Path(self.root).mkdir(parents=True, exist_ok=True)

    @property
    def root_uri(self) -> str:
        return f"{self.protocol}://{self.root}"

    def _path(self, rel: str) -> str:
        rel = rel.strip("/")
        if not rel or ".." in Path(rel).parts:
            raise ValueError(f"invalid store path {rel!r}")
        return f"{self.root}/{rel}"

    def uri(self, rel: str) -> str:
        return f"{self.protocol}://{self._path(rel)}"

    def exists(self, rel: str) -> bool:
        try:
            return bool(self.fs.exists(self._path(rel)))
        except Exception as exc:  # noqa: BLE001 - any backend failure is the infrastructure's
            raise InfraError("storage", f"cannot check {self.uri(rel)}: {exc}") from exc

    def size(self, rel: str) -> int | None:
        """An object's size in bytes; None when it is not there."""
        try:
            return int(self.fs.size(self._path(rel)))
        except FileNotFoundError:
            return None
        except Exception as exc:  # noqa: BLE001 - any backend failure is the infrastructure's
            raise InfraError("storage", f"cannot stat {self.uri(rel)}: {exc}") from exc

    def put_file(self, local: Path, rel: str, name: str | None = None) -> Artifact:
        """Upload a complete local file atomically and return its Artifact."""
        local = Path(local)
        digest, size = sha256_file(local), local.stat().st_size
        target = self._path(rel)
        try:
            if self.protocol == "file":
                Path(target).parent.mkdir(parents=True, exist_ok=True)
                tmp = f"{target}.tmp-{uuid.uuid4().hex}"
                try:
                    self.fs.put_file(str(local), tmp)
                    os.replace(tmp, target)
                finally:
                    if os.path.exists(tmp):
                        os.unlink(tmp)
            else:
                self.fs.put_file(str(local), target)
        except InfraError:
            raise
        except Exception as exc:  # noqa: BLE001
            raise InfraError("storage", f"writing {self.uri(rel)} failed: {exc}") from exc
        return Artifact(name=name or rel.rsplit("/", 1)[-1], uri=self.uri(rel), sha256=digest, size=size)

    def write_bytes(self, rel: str, data: bytes, name: str | None = None) -> Artifact:
        """Write bytes atomically (via a complete local temporary file)."""
        with tempfile.NamedTemporaryFile(prefix="swerl-", delete=False) as fh:
            fh.write(data)
            tmp = Path(fh.name)
        try:
            return self.put_file(tmp, rel, name=name)
        finally:
            tmp.unlink(missing_ok=True)

    def write_json(self, rel: str, obj: Any, name: str | None = None) -> Artifact:
        return self.write_bytes(rel, json.dumps(obj, indent=2, sort_keys=True).encode(), name=name)

    def read_bytes(self, rel: str) -> bytes:
        try:
            return bytes(self.fs.cat_file(self._path(rel)))
        except FileNotFoundError as exc:
            raise StoreFileMissing(self.uri(rel)) from exc
        except Exception as exc:  # noqa: BLE001
            raise InfraError("storage", f"reading {self.uri(rel)} failed: {exc}") from exc

    def read_parsed(self, rel: str, parse: Callable[[bytes], T], what: str = "") -> T:
        """Read an object and parse it; a parse failure raises CorruptStoreFile naming the object's URI."""
        data = self.read_bytes(rel)
        try:
            return parse(data)
        except Exception as exc:  # noqa: BLE001 - whatever the parser raises, the file is what is wrong
            detail = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
            kind = f"not a valid {what} " if what else ""
            raise CorruptStoreFile(self.uri(rel), f"{kind}({len(data)} bytes; {detail})") from exc

    def read_json(self, rel: str) -> Any:
        return self.read_parsed(rel, json.loads, "JSON document")

    def remove(self, rel: str, recursive: bool = False) -> None:
        """Delete an object (or, recursive, everything under a prefix); absent is not an error."""
        try:
            self.fs.rm(self._path(rel), recursive=recursive)
        except FileNotFoundError:
            return
        except Exception as exc:  # noqa: BLE001
            raise InfraError("storage", f"removing {self.uri(rel)} failed: {exc}") from exc

    def get_file(self, rel: str, local: Path) -> Path:
        """Download an object to a local path (atomically on the local side)."""
        local = Path(local)
        local.parent.mkdir(parents=True, exist_ok=True)
        tmp = local.with_name(local.name + f".tmp-{uuid.uuid4().hex}")
        try:
            self.fs.get_file(self._path(rel), str(tmp))
            os.replace(tmp, local)
        except FileNotFoundError as exc:
            raise StoreFileMissing(self.uri(rel)) from exc
        except Exception as exc:  # noqa: BLE001
            raise InfraError("storage", f"downloading {self.uri(rel)} failed: {exc}") from exc
        finally:
            tmp.unlink(missing_ok=True)
        return local

    def rel_of(self, uri: str) -> str:
        """The store-relative path of a URI inside this store, or of a path already relative to its root.

        Manifests record store-relative paths, so a store copied or synced elsewhere (another directory, file
        <-> S3) still resolves them; absolute URIs (older manifests) are accepted when inside this store.
        """
        if "://" not in uri:
            self._path(uri)  # validates it
            return uri.strip("/")
        prefix = self.root_uri + "/"
        if not uri.startswith(prefix):
            raise ValueError(
                f"{uri} is not inside store {self.root_uri} (an absolute URI written by a store that was "
                "since moved; manifests written now hold store-relative paths)"
            )
        return uri[len(prefix) :]

    def relative(self, uri: str) -> str:
        """What a manifest records for a URI: store-relative when inside this store, else unchanged."""
        try:
            return self.rel_of(uri)
        except ValueError:
            return uri

    def resolve(self, uri: str) -> str:
        """The full URI in this store of a store-relative path (an absolute URI is returned unchanged)."""
        return uri if "://" in uri else self.uri(uri)

    def list(self, rel: str) -> list[str]:
        """Store-relative paths directly under a prefix (empty if none)."""
        try:
            entries = self.fs.ls(self._path(rel), detail=False)
        except FileNotFoundError:
            return []
        except Exception as exc:  # noqa: BLE001
            raise InfraError("storage", f"listing {self.uri(rel)} failed: {exc}") from exc
        root = self.root + "/"
        # A writer killed mid-copy leaves a `.tmp-` sibling behind; it was never published, so it is not listed.
        return sorted(
            str(e)[len(root) :] if str(e).startswith(root) else str(e) for e in entries if ".tmp-" not in str(e)
        )


def open_store(
    root: str,
    *,
    s3_endpoint_url: str | None = None,
    s3_region: str | None = None,
    connect_timeout_s: float = 10.0,
    read_timeout_s: float = 60.0,
    max_attempts: int = 5,
    max_pool_connections: int = 16,
) -> Store:
    """Build a Store; S3 credentials come from the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY)."""
    options: dict[str, Any] = {}
    if root.startswith("s3://"):
        client_kwargs: dict[str, Any] = {}
        if s3_endpoint_url:
            client_kwargs["endpoint_url"] = s3_endpoint_url
        if s3_region:
            client_kwargs["region_name"] = s3_region
        options = {
            "client_kwargs": client_kwargs,
            "config_kwargs": {
                "connect_timeout": connect_timeout_s,
                "read_timeout": read_timeout_s,
                "retries": {"max_attempts": max_attempts, "mode": "standard"},
                "max_pool_connections": max_pool_connections,
            },
            # A fresh instance per store: fsspec's instance cache would share clients across event loops.
            "skip_instance_cache": True,
            # No listings cache: another process (a pipeline run, `swerl serve`) writes manifests while this
            # store is open, and a cached listing would hide them (a stale "not done" or "nothing pending").
            "use_listings_cache": False,
        }
    elif root.startswith("file://"):
        root = "file://" + str(Path(root[len("file://") :]).expanduser().resolve())
    return Store(root, options)
