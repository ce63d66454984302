"""Policy checkpoints: one safetensors file per policy version plus a JSON manifest.

Layout (a local folder or any filesystem URI: ``s3://bucket/run/checkpoints``, ``memory://x``, ...)::

    ROOT/policy_v000003.safetensors
    ROOT/policy_v000003.manifest.json   # sha256, dtype, parent version, config hash, ...

Design choices:

- Any local path or URI works, as for the trajectory store (:func:`storage.filesystems.resolve_filesystem`;
  URI options such as an S3 ``endpoint_override`` stay in the root and in every file URI the store hands
  out). On a local folder the weights are written in place (temporary name, rename; fsync and sha256 when the
  version is sealed); elsewhere they are serialised to a local temporary file first, then streamed up under a
  hidden temporary name and renamed (an object store shows the final object only once it is complete).
- The manifest is the commit marker. Weights are written first, the manifest last; a version exists only
  when its manifest does. A crash in between leaves at most an orphan weights file that no reader sees and
  the next save of that version replaces. The two halves can be called apart (:meth:`CheckpointStore.write_weights`,
  then :meth:`CheckpointStore.seal`): a GRPO trainer hands the written file to the engines on its node and
  hashes it once they loaded it.
- Loading checks the file's sha256 against the manifest (on by default) before trusting it.
- Tensors that share memory (tied embeddings, e.g. ``lm_head.weight`` is ``embed_tokens.weight``)
  are stored once; the manifest's ``aliases`` maps the dropped name to the stored one and loading
  restores the tie (both names point to one tensor).
- Retention (optional): keep the last ``keep_last`` versions plus every version divisible by
  ``keep_every``; it runs after each save. Deletion removes the manifest first (invisible at once).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import os
import re
import shutil
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
import torch
from safetensors.torch import load, load_file, save_file

from storage.checkpoint_manifest import (
    CheckpointError,
    CheckpointManifest,
    LoadedCheckpoint,
    WrittenWeights,
    dedupe_shared,
)
from storage.filesystems import (
    is_local,
    join_uri,
    publish,
    read_bytes,
    resolve_filesystem,
    split_uri,
    temp_name_for,
    write_bytes_atomic,
)
from storage.hashing import config_hash as compute_config_hash
from storage.hashing import file_sha256

_FILE = re.compile(r"^policy_v(\d{6,})\.manifest\.json$")
_WEIGHTS = re.compile(r"^policy_v(\d{6,})\.safetensors$")

__all__ = [
    "CheckpointError",
    "CheckpointManifest",
    "CheckpointStore",
    "LoadedCheckpoint",
    "WrittenWeights",
    "dedupe_shared",
]


class CheckpointStore:
    """Save and load policy weights by version under a local folder or any filesystem URI, atomically, with
    optional retention.

    ``CheckpointStore("runs/r/checkpoints")``, ``CheckpointStore("s3://bucket/r/checkpoints?endpoint_override=...")``
    or ``CheckpointStore("ckpt", filesystem=fsspec_or_pyarrow_fs)``. ``root`` is a :class:`~pathlib.Path` for a
    local store and the URI as given otherwise; :meth:`weights_path` and :meth:`manifest_path` follow suit
    (a path, or a URI that :meth:`from_weights_uri` and :func:`~storage.filesystems.resolve_filesystem` open
    again in any process; with an explicit ``filesystem`` they are paths on it).
    """

    def __init__(
        self,
        root: str | os.PathLike[str],
        keep_last: int | None = None,
        keep_every: int | None = None,
        filesystem: Any = None,
    ) -> None:
        self.uri = os.fspath(root)
        self.fs, self._dir = resolve_filesystem(root, filesystem)
        self.local = is_local(self.fs)
        self.explicit_filesystem = filesystem is not None
        self.root: Path | str = Path(self._dir) if self.local else self.uri
        if keep_last is not None and keep_last < 1:
            raise ValueError(f"keep_last must be >= 1, got {keep_last}")
        if keep_every is not None and keep_every < 1:
            raise ValueError(f"keep_every must be >= 1, got {keep_every}")
        self.keep_last = keep_last
        self.keep_every = keep_every

    def __repr__(self) -> str:
        return f"CheckpointStore({str(self.root)!r}, keep_last={self.keep_last}, keep_every={self.keep_every})"

    @classmethod
    def from_weights_uri(cls, uri: str | os.PathLike[str]) -> tuple[CheckpointStore, int]:
        """The store and version of a weights file named by :meth:`weights_path` (a path or a URI)."""
        folder, name = split_uri(uri)
        match = _WEIGHTS.match(name)
        if not match or not folder or folder.startswith("?"):
            raise CheckpointError(
                f"{os.fspath(uri)}: not the weights file of a checkpoint (policy_vNNNNNN.safetensors)"
            )
        return cls(folder), int(match.group(1))

    # ----------------------------------------------------------------- names
    def _file(self, name: str) -> str:
        """Path of a file of the store on its filesystem."""
        return f"{self._dir.rstrip('/')}/{name}"

    def _ref(self, name: str) -> Path | str:
        """What the store hands out for one of its files: a local path, else a URI (query options kept)."""
        if self.local:
            return Path(self._file(name))
        if self.explicit_filesystem:
            return self._file(name)
        return join_uri(self.uri, name)

    @staticmethod
    def _weights_name(version: int) -> str:
        return f"policy_v{_check_version(version):06d}.safetensors"

    @staticmethod
    def _manifest_name(version: int) -> str:
        return f"policy_v{_check_version(version):06d}.manifest.json"

    def weights_path(self, version: int) -> Path | str:
        """The safetensors file of a version: a path in a local store, else its URI."""
        return self._ref(self._weights_name(version))

    def weights_uri(self, version: int) -> str:
        """The safetensors file of a version as a URI (``file:///...`` in a local store), for lineage and UIs."""
        ref = self.weights_path(version)
        return Path(ref).absolute().as_uri() if isinstance(ref, Path) else str(ref)

    def manifest_path(self, version: int) -> Path | str:
        """The manifest of a version: a path in a local store, else its URI."""
        return self._ref(self._manifest_name(version))

    def _exists(self, path: str) -> bool:
        return self.fs.get_file_info(path).type == pafs.FileType.File

    # ----------------------------------------------------------------- reading
    def versions(self) -> list[int]:
        """Committed versions (those with a manifest), ascending."""
        if self.fs.get_file_info(self._dir).type != pafs.FileType.Directory:
            return []
        entries = self.fs.get_file_info(pafs.FileSelector(self._dir))
        return sorted(int(m.group(1)) for e in entries if (m := _FILE.match(e.base_name)))

    def latest_version(self) -> int | None:
        """The highest committed version, or None when the store is empty."""
        found = self.versions()
        return found[-1] if found else None

    def manifest(self, version: int | None = None) -> CheckpointManifest:
        """The manifest of a version (latest when None)."""
        version = self._resolve(version)
        path = self._file(self._manifest_name(version))
        where = str(self.manifest_path(version))
        try:
            text = read_bytes(self.fs, path).decode("utf-8")
        except FileNotFoundError as err:
            raise CheckpointError(f"no checkpoint for policy version {version} in {self.root}") from err
        except (OSError, pa.ArrowException) as err:
            if not self._exists(path):
                raise CheckpointError(f"no checkpoint for policy version {version} in {self.root}") from err
            raise
        manifest = CheckpointManifest.from_json(text, where)
        if manifest.policy_version != version:
            raise CheckpointError(f"{where}: field 'policy_version' is {manifest.policy_version}, expected {version}")
        return manifest

    def read_weights(self, version: int | None = None, *, verify: bool = True) -> bytes:
        """The safetensors bytes of a version (latest when None), checked against the manifest's sha256 with
        ``verify`` (what an engine on another node loads when the store is not on its disk)."""
        manifest = self.manifest(version)
        data = self._read_weights_file(manifest)
        if verify:
            self._check_sha(hashlib.sha256(data).hexdigest(), manifest)
        return data

    def load(self, version: int | None = None, *, device: str = "cpu", verify: bool = True) -> LoadedCheckpoint:
        """Load a version (latest when None); with ``verify`` the sha256 must match the manifest."""
        manifest = self.manifest(version)
        ref = self._ref(manifest.weights_file)
        if self.local:
            path = Path(self._file(manifest.weights_file))
            if not path.is_file():
                raise CheckpointError(f"{path}: weights file of policy version {manifest.policy_version} is missing")
            if verify:
                self._check_sha(file_sha256(path), manifest)
            state = load_file(str(path), device=device)
        else:
            data = self._read_weights_file(manifest)
            if verify:
                self._check_sha(hashlib.sha256(data).hexdigest(), manifest)
            state = {name: tensor.to(device) for name, tensor in load(data).items()}
        for alias, target in manifest.aliases.items():
            state[alias] = state[target]
        return LoadedCheckpoint(state_dict=state, manifest=manifest, path=ref)

    def verify(self, version: int) -> CheckpointManifest:
        """Check a version's checkpoint without loading it (a resume, before any worker starts): the manifest
        reads, the weights file is there at the manifest's size and, on a local store, its sha256 matches; else a
        :class:`CheckpointError` naming the file."""
        manifest = self.manifest(version)
        info = self.fs.get_file_info(self._file(manifest.weights_file))
        ref = self._ref(manifest.weights_file)
        if info.type != pafs.FileType.File:
            raise CheckpointError(f"{ref}: weights file of policy version {version} is missing")
        if info.size != manifest.size_bytes:
            raise CheckpointError(
                f"{ref}: {info.size} bytes, but its manifest says {manifest.size_bytes} (truncated or damaged "
                "checkpoint)"
            )
        if self.local:
            self._check_sha(file_sha256(self._file(manifest.weights_file)), manifest)
        return manifest

    def _read_weights_file(self, manifest: CheckpointManifest) -> bytes:
        path = self._file(manifest.weights_file)
        if not self._exists(path):
            raise CheckpointError(
                f"{self._ref(manifest.weights_file)}: weights file of policy version {manifest.policy_version} "
                "is missing"
            )
        return read_bytes(self.fs, path)

    def _check_sha(self, actual: str, manifest: CheckpointManifest) -> None:
        if actual != manifest.sha256:
            raise CheckpointError(
                f"{self._ref(manifest.weights_file)}: sha256 {actual} does not match the manifest's "
                f"{manifest.sha256} (corrupt checkpoint)"
            )

    # ----------------------------------------------------------------- writing
    def save(
        self,
        state_dict: Mapping[str, torch.Tensor],
        policy_version: int,
        *,
        parent_version: int | None = None,
        config: Any = None,
        config_hash: str | None = None,
        model_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
    ) -> CheckpointManifest:
        """Write the weights of ``policy_version`` and its manifest atomically; returns the manifest.

        Saving a version again replaces it (idempotent re-runs). ``config`` is hashed with
        :func:`storage.hashing.config_hash` unless ``config_hash`` is given. The same as :meth:`write_weights`
        followed by :meth:`seal`.
        """
        _check_parent(policy_version, parent_version)
        _checked_config_hash(config, config_hash)  # a bad hash fails before anything is written
        written = self.write_weights(state_dict, policy_version)
        return self.seal(
            written,
            parent_version=parent_version,
            config=config,
            config_hash=config_hash,
            model_id=model_id,
            metadata=metadata,
        )

    def write_weights(self, state_dict: Mapping[str, torch.Tensor], policy_version: int) -> WrittenWeights:
        """The first half of :meth:`save`: the weights file, complete at its final name, but no manifest yet, so
        the version does not exist for readers of the store until :meth:`seal` commits it.

        On a local folder this is a temporary file renamed into place, without fsync or hash (the seal does both,
        so a trainer can hand the file to engines on its node first and hash it afterwards). A remote store
        hashes the serialised file before the upload, as it must read it anyway. A manifest left by an earlier save
        of this version is removed first: it describes other bytes.
        """
        _check_version(policy_version)
        tensors, aliases = dedupe_shared(state_dict)
        if not tensors:
            raise CheckpointError("refusing to save an empty state_dict")
        self.fs.create_dir(self._dir, recursive=True)
        name = self._weights_name(policy_version)
        _remove_quietly(self.fs, self._file(self._manifest_name(policy_version)))
        header = {"format": "llmrl"}  # the version is the manifest's: the same weights give the same file and sha256
        sha: str | None = None
        size: int | None = None
        if self.local:
            _write_local(tensors, self._file(name), header)
        else:
            sha, size = self._save_remote(tensors, self._file(name), header)
        dtypes = Counter(str(t.dtype).removeprefix("torch.") for t in tensors.values())
        return WrittenWeights(
            policy_version=policy_version,
            weights_file=name,
            dtypes=dict(sorted(dtypes.items())),
            num_tensors=len(tensors),
            num_parameters=sum(t.numel() for t in tensors.values()),
            aliases=aliases,
            sha256=sha,
            size_bytes=size,
        )

    def seal(
        self,
        written: WrittenWeights,
        *,
        parent_version: int | None = None,
        config: Any = None,
        config_hash: str | None = None,
        model_id: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        protect: Iterable[int] = (),
    ) -> CheckpointManifest:
        """The second half of :meth:`save`: make the written weights durable (fsync), hash them, write the
        manifest (the version now exists) and apply retention, which keeps this version and those in ``protect``
        (e.g. the ones a resume still needs while this version is not committed by its caller); returns the
        manifest."""
        policy_version = written.policy_version
        _check_parent(policy_version, parent_version)
        config_hash = _checked_config_hash(config, config_hash)
        sha, size = written.sha256, written.size_bytes
        if sha is None or size is None:
            path = self._file(written.weights_file)
            if not os.path.isfile(path):
                raise CheckpointError(
                    f"{path}: weights file of policy version {policy_version} is missing (not sealed)"
                )
            with open(path, "rb+") as fh:
                os.fsync(fh.fileno())
            sha, size = file_sha256(path), os.path.getsize(path)
        manifest = CheckpointManifest(
            policy_version=policy_version,
            parent_version=parent_version,
            weights_file=written.weights_file,
            sha256=sha,
            size_bytes=size,
            dtype=next(iter(written.dtypes)) if len(written.dtypes) == 1 else "mixed",
            dtypes=dict(written.dtypes),
            num_tensors=written.num_tensors,
            num_parameters=written.num_parameters,
            aliases=dict(written.aliases),
            config_hash=config_hash,
            model_id=model_id,
            created_at=dt.datetime.now(dt.UTC).isoformat(),
            metadata=dict(metadata or {}),
        )
        _write_text_atomic(self.fs, self._file(self._manifest_name(policy_version)), manifest.to_json())
        self.apply_retention(protect={policy_version, *protect})
        return manifest

    def _save_remote(self, tensors: dict[str, torch.Tensor], path: str, header: dict[str, str]) -> tuple[str, int]:
        """Serialise to a local temporary file, then stream it up under a hidden name and rename it."""
        scratch = tempfile.mkdtemp(prefix="llmrl-ckpt-")
        temp = temp_name_for(path)
        try:
            local = os.path.join(scratch, "weights.safetensors")
            save_file(tensors, local, metadata=header)
            sha, size = file_sha256(local), os.path.getsize(local)
            with open(local, "rb") as src, self.fs.open_output_stream(temp) as out:
                while block := src.read(1 << 24):
                    out.write(block)
            publish(self.fs, temp, path)
        except BaseException:
            _remove_quietly(self.fs, temp)
            raise
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
        return sha, size

    def delete(self, version: int) -> None:
        """Remove a version: the manifest first (invisible at once), then the weights."""
        for name in (self._manifest_name(version), self._weights_name(version)):
            _remove_quietly(self.fs, self._file(name))

    def retained(self, versions: list[int]) -> set[int]:
        """Which of ``versions`` the retention policy keeps (all when no policy is set)."""
        if self.keep_last is None and self.keep_every is None:
            return set(versions)
        keep = set(sorted(versions)[-self.keep_last :]) if self.keep_last else set()
        if self.keep_every:
            keep |= {v for v in versions if v % self.keep_every == 0}
        return keep

    def apply_retention(self, protect: int | Iterable[int] | None = None) -> list[int]:
        """Delete versions the policy does not keep (never those in ``protect``); returns the deleted versions."""
        versions = self.versions()
        protected = {protect} if isinstance(protect, int) else set(protect or ())
        keep = self.retained(versions) | protected
        removed = [v for v in versions if v not in keep]
        for version in removed:
            self.delete(version)
        return removed

    def _resolve(self, version: int | None) -> int:
        if version is not None:
            return _check_version(version)
        latest = self.latest_version()
        if latest is None:
            raise CheckpointError(f"no checkpoints in {self.root}")
        return latest


def _check_version(version: int) -> int:
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise CheckpointError(f"policy version must be an int >= 0, got {version!r}")
    return version


def _check_parent(version: int, parent_version: int | None) -> None:
    _check_version(version)
    if parent_version is not None and _check_version(parent_version) >= version:
        raise CheckpointError(f"parent_version {parent_version} must be lower than policy_version {version}")


def _checked_config_hash(config: Any, config_hash: str | None) -> str | None:
    """``config``'s hash (``config_hash`` when no config is given); a given hash that differs is an error."""
    if config is None:
        return config_hash
    computed = compute_config_hash(config)
    if config_hash is not None and config_hash != computed:
        raise CheckpointError(f"config_hash {config_hash} does not match the given config ({computed})")
    return computed


def _write_local(tensors: dict[str, torch.Tensor], path: str, header: dict[str, str]) -> None:
    """Write a safetensors file under a temporary name and rename it into place (readers never see a part)."""
    temp = Path(temp_name_for(path))
    try:
        save_file(tensors, str(temp), metadata=header)
        os.replace(temp, path)
    except BaseException:
        temp.unlink(missing_ok=True)
        raise


def _write_text_atomic(fs: pafs.FileSystem, path: str, text: str) -> None:
    write_bytes_atomic(fs, path, text.encode("utf-8"))


def _remove_quietly(fs: pafs.FileSystem, path: str) -> None:
    """Delete a file; no error when it is not there."""
    try:
        fs.delete_file(path)
    except FileNotFoundError:
        pass
    except (OSError, pa.ArrowException):
        if fs.get_file_info(path).type != pafs.FileType.NotFound:
            raise
