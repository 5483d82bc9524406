"""``python -m upwell.local.devhost``: run the local Functions host until SIGINT or SIGTERM.

Like ``func start``, it reads ``local.settings.json`` (``Values`` become
environment variables unless already set) and ``host.json`` from the script
root, then serves HTTP triggers and the blobs webhook on 127.0.0.1, runs the local
Event Grid publisher for ``source=EventGrid`` blob triggers (faults from
``UPWELL_EVENT_FAULTS``), and polls storage for the rest.
On a signal it stops listening, releases what has not started, and waits for
running invocations up to ``--shutdown-grace`` seconds.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from pathlib import Path

from upwell import logs
from upwell.errors import ConfigError
from upwell.local.devhost.config import load_local_settings
from upwell.local.devhost.host import DevHost


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m upwell.local.devhost", description=__doc__.split("\n\n")[0])
    parser.add_argument("--app", default="function_app:app", help="module:attr of the FunctionApp")
    parser.add_argument("--script-root", type=Path, default=Path.cwd(),
                        help="folder of function_app.py, host.json and local.settings.json (default: .)")
    parser.add_argument("--host-json", type=Path, help="host.json to read (default: <script-root>/host.json)")
    parser.add_argument("--port", type=int, default=7071, help="HTTP port on 127.0.0.1 (default 7071; 0: any)")
    parser.add_argument("--no-http", action="store_true", help="do not serve HTTP triggers")
    parser.add_argument("--functions", nargs="+", metavar="NAME", help="drive only these functions")
    parser.add_argument("--poll-interval", type=float, default=1.0, help="seconds between blob scans (default 1)")
    parser.add_argument("--host-id", help="host id for blob receipts (default: AzureFunctionsWebHost__hostid "
                                          "or the machine name)")
    parser.add_argument("--shutdown-grace", type=float, default=30.0,
                        help="seconds to wait for running invocations on shutdown (default 30)")
    return parser.parse_args(argv)


def configure_logging() -> None:
    """upwell's structlog setup (JSON, secrets redacted), and stdlib logging (what handlers use) at INFO."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(levelname)s %(name)s: %(message)s")
    logs.configure()


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    configure_logging()
    try:
        load_local_settings(args.script_root / "local.settings.json")
        host = DevHost(args.app, host_json=args.host_json, port=None if args.no_http else args.port,
                       poll_interval=args.poll_interval, host_id=args.host_id, functions=args.functions,
                       script_root=args.script_root, shutdown_grace=args.shutdown_grace)
    except ConfigError as exc:
        print(f"devhost: {exc}", file=sys.stderr)
        return 2
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    try:
        host.start()
    except OSError as exc:
        print(f"devhost: cannot listen on 127.0.0.1:{args.port}: {exc}", file=sys.stderr)
        host.stop(grace=0)
        return 2
    for spec in host.specs:
        route = f"{host.config.route_prefix}/{spec.trigger.get('route') or spec.name}".lstrip("/")
        where = f" {host.http_url}/{route}" if spec.trigger_type == "httpTrigger" and host.http_url else ""
        print(f"  {spec.name}: {spec.trigger_type}{where}", file=sys.stderr)
    while not done.wait(1.0):
        pass
    if host.stop():
        # Past the grace: exit without joining the invocation threads; their leases lapse.
        sys.stderr.flush()
        os._exit(0)
    return 0


if __name__ == "__main__":
    sys.exit(main())
