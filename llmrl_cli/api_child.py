"""``python -m llmrl_cli.api_child PARENT_PID PORT``: Prefect's API under uvicorn on 127.0.0.1:PORT, ending when the
process PARENT_PID dies (see :mod:`llmrl_cli.run_api`)."""

from __future__ import annotations

import ctypes
import os
import signal
import sys

PR_SET_PDEATHSIG = 1


def main() -> None:
    """Arrange SIGTERM on the parent's death, check the parent still lives (it may have died before), then serve."""
    parent, port = int(sys.argv[1]), int(sys.argv[2])
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
    if os.getppid() != parent:
        sys.exit(0)
    import uvicorn

    uvicorn.run(
        "prefect.server.api.server:create_app",
        factory=True,
        host="127.0.0.1",
        port=port,
        log_level="error",
        lifespan="on",
    )


if __name__ == "__main__":
    main()
