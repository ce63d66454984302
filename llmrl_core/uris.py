"""Options a filesystem URI of ours may carry beyond what pyarrow's URI parser accepts.

``s3://bucket/runs?endpoint_override=host:9000&request_timeout=600&connect_timeout=10``: pyarrow's
``FileSystem.from_uri`` rejects the two timeouts, so they are taken out of the query here and given to
``pyarrow.fs.S3FileSystem`` by ``storage.filesystems.resolve_filesystem``. The request timeout matters: the AWS
SDK's default aborts a request that receives no byte for 3 seconds, and a server-side copy of a large object
answers only when it is done.
"""

from __future__ import annotations

S3_REQUEST_TIMEOUT_S = 300.0
S3_TIMEOUT_OPTIONS = ("request_timeout", "connect_timeout")


def split_s3_timeouts(uri: str) -> tuple[str, dict[str, float]]:
    """``(uri without them, {option: seconds})`` for the timeout options of an ``s3://`` URI's query (pyarrow's
    URI parser rejects them); any other URI comes back unchanged with no options.

    Raises ValueError naming the option when its value is not a positive number of seconds.
    """
    if not uri.startswith("s3://") or "?" not in uri:
        return uri, {}
    base, _, query = uri.partition("?")
    kept: list[str] = []
    timeouts: dict[str, float] = {}
    for item in query.split("&"):
        key, _, value = item.partition("=")
        if key not in S3_TIMEOUT_OPTIONS:
            kept.append(item)
            continue
        try:
            seconds = float(value)
        except ValueError:
            seconds = -1.0
        if not seconds > 0:
            raise ValueError(f"{uri!r}: {key}={value!r} must be a positive number of seconds")
        timeouts[key] = seconds
    return (f"{base}?{'&'.join(kept)}" if kept else base), timeouts
