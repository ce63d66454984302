"""Resolve a local path or URI to a pyarrow filesystem, and publish files atomically on it.

Every store in ``storage`` speaks pyarrow's filesystem API, so the same code runs on a local folder,
``file://`` URIs, pyarrow's native filesystems (``s3://``, ``gs://``, ``hdfs://``) and any fsspec
filesystem (``memory://``, ``s3://`` through s3fs, ...), which is wrapped with ``FSSpecHandler``.
pyarrow is asked first; a scheme it does not know goes to fsspec.

Atomic publication: a file is written under a temporary name that starts with ``.`` in the same
folder, then renamed over the final name. On a local disk the rename is ``os.replace`` after an
``fsync`` (atomic on POSIX); on an object store the final object appears only once it is complete.
Readers skip names that start with ``.`` or ``_`` (pyarrow's own convention), so a crash between the
temporary write and the rename leaves nothing visible.

S3 filesystems opened from a URI wait up to ``request_timeout`` seconds for an answer (default
:data:`~llmrl_core.uris.S3_REQUEST_TIMEOUT_S`, not the AWS SDK's 3 s, which failed the server-side copy of the
rename above on large objects); ``llmrl_core.uris`` says how a URI sets it.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from typing import IO, Any

import pyarrow as pa
import pyarrow.fs as pafs

from llmrl_core.uris import S3_REQUEST_TIMEOUT_S, split_s3_timeouts

TEMP_MARKER = ".tmp-"


def resolve_filesystem(root: str | os.PathLike[str], filesystem: Any = None) -> tuple[pafs.FileSystem, str]:
    """Return ``(pyarrow filesystem, path on it)`` for a local path or URI.

    ``filesystem`` may be given explicitly (a pyarrow filesystem or an fsspec one); ``root`` is then a
    path on it.
    """
    root = os.fspath(root)
    if filesystem is not None:
        if not isinstance(filesystem, pafs.FileSystem):
            filesystem = pafs.PyFileSystem(pafs.FSSpecHandler(filesystem))
        return filesystem, root.rstrip("/") or "/"
    if "://" not in root:
        return pafs.LocalFileSystem(), os.path.abspath(os.path.expanduser(root))
    uri, timeouts = split_s3_timeouts(root)
    try:
        fs, path = pafs.FileSystem.from_uri(uri)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        import fsspec

        fsspec_fs, path = fsspec.core.url_to_fs(root)
        fs = pafs.PyFileSystem(pafs.FSSpecHandler(fsspec_fs))
    else:
        if isinstance(fs, pafs.S3FileSystem):
            fs = _with_timeouts(fs, timeouts)
    return fs, path.rstrip("/") or "/"


def _with_timeouts(fs: pafs.S3FileSystem, timeouts: dict[str, float]) -> pafs.S3FileSystem:
    """The same S3 filesystem with ``timeouts`` applied and the request timeout raised from the SDK's 3 s
    default to :data:`S3_REQUEST_TIMEOUT_S` when the URI did not name one."""
    rebuild, (options,) = fs.__reduce__()  # pyarrow's own pickling: every option the URI set
    options = {**options, "request_timeout": S3_REQUEST_TIMEOUT_S, **timeouts}
    return rebuild(options)


def is_remote_uri(location: str | os.PathLike[str] | None) -> bool:
    """True for a URI of another filesystem than the local disk (``s3://...``, ``memory://...``); False for a
    path, a ``file://`` URI or None."""
    text = os.fspath(location) if location is not None else ""
    return "://" in text and not text.startswith("file://")


def join_uri(base: str | os.PathLike[str], *parts: str) -> str:
    """``base`` with ``parts`` appended as path segments; a URI keeps its query options (e.g. an S3
    ``endpoint_override``) at the end: ``join_uri("s3://b/runs?scheme=http", "r", "ckpt")`` is
    ``s3://b/runs/r/ckpt?scheme=http``."""
    text = os.fspath(base)
    base_part, sep, query = text.partition("?") if "://" in text else (text, "", "")
    path = "/".join([base_part.rstrip("/"), *(p.strip("/") for p in parts if p.strip("/"))])
    return f"{path}{sep}{query}"


def split_uri(location: str | os.PathLike[str]) -> tuple[str, str]:
    """``(parent, name)`` of a file's path or URI, the query options kept on the parent (inverse of
    :func:`join_uri`)."""
    text = os.fspath(location)
    base, sep, query = text.partition("?") if "://" in text else (text, "", "")
    folder, _, name = base.rstrip("/").rpartition("/")
    return f"{folder}{sep}{query}", name


def is_local(fs: pafs.FileSystem) -> bool:
    """True for pyarrow's local filesystem (where os-level rename and fsync apply)."""
    return isinstance(fs, pafs.LocalFileSystem)


def is_temp_name(name: str) -> bool:
    """True for names readers must skip: temporary files and hidden/underscore files."""
    base = name.rsplit("/", 1)[-1]
    return base.startswith((".", "_")) or TEMP_MARKER in base


def temp_name_for(path: str) -> str:
    """A unique hidden temporary name in the same folder as ``path``."""
    folder, _, base = path.rpartition("/")
    return f"{folder}/.{base}{TEMP_MARKER}{os.getpid()}-{uuid.uuid4().hex[:8]}"


def publish(fs: pafs.FileSystem, temp_path: str, final_path: str) -> None:
    """Rename a completely written temporary file over its final name (replacing an older one)."""
    if is_local(fs):
        os.replace(temp_path, final_path)
        _fsync_dir(os.path.dirname(final_path))
    else:
        fs.move(temp_path, final_path)


def write_bytes_atomic(fs: pafs.FileSystem, path: str, data: bytes | pa.Buffer) -> None:
    """Write ``data`` to ``path`` atomically: temporary file in the same folder, then rename."""
    write_atomic(fs, path, lambda out: out.write(memoryview(data)))


def write_atomic(fs: pafs.FileSystem, path: str, write: Callable[[IO[bytes]], Any]) -> None:
    """Call ``write`` with a binary file to fill, then publish that file at ``path`` atomically (temporary file
    in the same folder, fsync on a local disk, rename). ``write`` streams straight into the temporary file or
    object, so a serialiser such as ``torch.save`` needs no in-memory copy of what it writes."""
    folder = path.rpartition("/")[0]
    fs.create_dir(folder, recursive=True)
    temp = temp_name_for(path)
    try:
        if is_local(fs):
            with open(temp, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
        else:
            with fs.open_output_stream(temp) as out:
                write(out)
        publish(fs, temp, path)
    except BaseException:
        _remove_quietly(fs, temp)
        raise


def read_bytes(fs: pafs.FileSystem, path: str) -> bytes:
    """The whole content of a file, in one read (on an object store: one GET of the whole object, where a
    stream would issue a ranged GET per buffer-full)."""
    with fs.open_input_file(path) as handle:
        return handle.read()


def _fsync_dir(folder: str) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _remove_quietly(fs: pafs.FileSystem, path: str) -> None:
    try:
        fs.delete_file(path)
    except (OSError, pa.ArrowException):
        pass
