"""A single-threaded moto server on 127.0.0.1 for the tests (Kinesis and DynamoDB).

moto's own threaded server loses acknowledged Kinesis records under
concurrent writers (non-atomic sequence numbers, DESIGN section 4); serving
one request at a time does not. Run as ``python -m tests.support.motoserver PORT``.
"""

from __future__ import annotations

import sys

from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server


def main() -> None:
    port = int(sys.argv[1])
    app = DomainDispatcherApplication(create_backend_app)
    server = make_server("127.0.0.1", port, app, threaded=False)
    print(f"listening on 127.0.0.1:{server.port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
