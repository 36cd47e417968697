"""`python -m fenced_k8s_lab.kubeapi --host 127.0.0.1 --port N` — run the emulator.

Prints `READY <url>` on stdout once listening, so a parent process can wait for it.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading

from .emulator import Emulator, check_loopback


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m fenced_k8s_lab.kubeapi", description=__doc__)
    ap.add_argument("--host", default="127.0.0.1", help="loopback address only")
    ap.add_argument("--port", type=int, default=0, help="0 picks a free port")
    ap.add_argument("--history-size", type=int, default=1000, help="watch events kept for resume")
    ap.add_argument("--bookmark-interval", type=float, default=60.0, help="seconds between BOOKMARKs")
    ap.add_argument("--tokens", default="{}", help='JSON map of bearer token -> caller name')
    ap.add_argument("--kubeconfig", help="also write a kubeconfig for this server here")
    ap.add_argument("--token", help="bearer token for --kubeconfig")
    args = ap.parse_args(argv)
    try:
        check_loopback(args.host)
    except ValueError as exc:
        ap.error(str(exc))
    emu = Emulator(args.host, args.port, history_size=args.history_size, tokens=json.loads(args.tokens),
                   bookmark_interval=args.bookmark_interval)
    url = emu.start()
    if args.kubeconfig:
        emu.write_kubeconfig(args.kubeconfig, token=args.token)
    print(f"READY {url}", flush=True)
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    while not done.wait(1.0):
        pass
    emu.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
