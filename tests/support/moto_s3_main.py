"""moto's S3 server with its writes made atomic, as S3's are: ``python moto_s3_main.py HOST PORT``.

moto answers a conditional PUT (``If-None-Match: *``) by checking for the key and then storing
it, in whichever server thread took the request; two racing writers can both pass the check.
S3 itself decides conditional writes atomically, and the fencing tests race writers on purpose,
so this server takes one mutating request at a time (reads stay concurrent).
"""

from __future__ import annotations

import signal
import sys
import threading
from collections.abc import Callable, Iterable
from typing import Any

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)
from werkzeug.serving import run_simple

_WRITES = frozenset({"PUT", "POST", "DELETE"})


class _AtomicWrites:
    def __init__(self, app: Callable[..., Iterable[bytes]]) -> None:
        self._app = app
        self._lock = threading.Lock()

    def __call__(self, environ: dict[str, Any], start_response: Callable[..., Any]) -> Any:
        if environ.get("REQUEST_METHOD") not in _WRITES:
            return self._app(environ, start_response)
        with self._lock:
            # the whole body is produced under the lock: moto stores the key while it answers
            return list(self._app(environ, start_response))


def main() -> None:
    host, port = sys.argv[1], int(sys.argv[2])
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(host, port, _AtomicWrites(app), threaded=True, request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main()
