"""A local S3 for tests: moto's threaded server on 127.0.0.1 (a free port) with one bucket.

pyarrow's native ``S3FileSystem`` talks to it (no s3fs needed) through a URI that carries the endpoint::

    s3://llmrl/some/root?endpoint_override=127.0.0.1:PORT&scheme=http&region=us-east-1

Credentials are test values in ``AWS_ACCESS_KEY_ID`` / ``AWS_SECRET_ACCESS_KEY`` (set while the server runs,
restored afterwards); a subprocess that should reach the server needs :attr:`S3Server.env` in its environment.
Use the ``s3_server`` fixture of ``conftest.py``, or :func:`moto_s3` directly.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@dataclass
class S3Server:
    """A running moto S3 server: its ``host:port``, its bucket and the environment a client needs."""

    endpoint: str
    bucket: str
    env: dict[str, str] = field(default_factory=lambda: dict(CREDENTIALS))

    def uri(self, path: str = "") -> str:
        """A pyarrow URI for ``path`` in the bucket (the endpoint and scheme in its query)."""
        key = f"/{path.strip('/')}" if path.strip("/") else ""
        return f"s3://{self.bucket}{key}?endpoint_override={self.endpoint}&scheme=http&region=us-east-1"

    def client(self) -> object:
        """A boto3 S3 client of the server (to look at objects behind the code under test's back)."""
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=f"http://{self.endpoint}",
            region_name="us-east-1",
            aws_access_key_id=CREDENTIALS["AWS_ACCESS_KEY_ID"],
            aws_secret_access_key=CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        )

    def reset(self) -> None:
        """Drop every bucket and object (moto's state is shared by all its servers in this process)."""
        import urllib.request

        urllib.request.urlopen(urllib.request.Request(f"http://{self.endpoint}/moto-api/reset", method="POST")).close()

    def keys(self, prefix: str = "") -> list[str]:
        """Every object key under ``prefix``, sorted (directory markers, ending in ``/``, left out)."""
        listing = self.client().list_objects_v2(Bucket=self.bucket, Prefix=prefix.lstrip("/"))  # type: ignore[attr-defined]
        return sorted(o["Key"] for o in listing.get("Contents", []) if not o["Key"].endswith("/"))


@contextmanager
def moto_s3(bucket: str = "llmrl") -> Iterator[S3Server]:
    """Start moto's S3 on 127.0.0.1 with an empty ``bucket``; stop it (and restore the AWS variables) at the end."""
    from moto.server import ThreadedMotoServer

    logging.getLogger("werkzeug").setLevel(logging.WARNING)  # one log line per request otherwise
    saved = {k: os.environ.get(k) for k in CREDENTIALS}
    os.environ.update(CREDENTIALS)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    s3: S3Server | None = None
    try:
        host, port = server.get_host_and_port()
        s3 = S3Server(f"{host}:{port}", bucket)
        s3.reset()  # moto keeps its buckets in-process: start empty whatever an earlier server left
        s3.client().create_bucket(Bucket=bucket)  # type: ignore[attr-defined]
        yield s3
    finally:
        if s3 is not None:
            with contextlib.suppress(OSError):
                s3.reset()
        server.stop()
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
