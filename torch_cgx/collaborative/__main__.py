"""``python -m torch_cgx.collaborative``: a standalone Lighthouse (the rendezvous) for peers
that may all come and go; it must stay up while they train."""

from __future__ import annotations

import argparse
import signal
import threading

from torch_cgx.collaborative.rendezvous import Lighthouse, local_host


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(
        prog="python -m torch_cgx.collaborative",
        description="Run the rendezvous (a torchft Lighthouse) of a collaboration; peers pass "
        "its address as initial_peers.",
    )
    ap.add_argument("--port", type=int, default=29510, help="port (0: any free one)")
    ap.add_argument("--host", default=None, help="the address peers reach it at (printed)")
    ap.add_argument(
        "--matchmaking-time",
        type=float,
        default=15.0,
        help="seconds a round waits for live peers that are late (default 15)",
    )
    ap.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=2.0,
        help="seconds of silence after which a peer is dropped (default 2)",
    )
    ap.add_argument(
        "--averaging-timeout",
        type=float,
        default=60.0,
        help="the peers' averaging_timeout: a round waits matchmaking time + this from its "
        "first request (which may come from a peer the last round left out; default 60)",
    )
    ap.add_argument("--min-peers", type=int, default=1, help="peers a round needs (default 1)")
    args = ap.parse_args(argv)
    server = Lighthouse(
        local_host(None, args.host),
        args.port,
        join_timeout=args.matchmaking_time + args.averaging_timeout,
        heartbeat_timeout=args.heartbeat_timeout,
        min_peers=args.min_peers,
    )
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):  # before the address is out: a stop right
        signal.signal(sig, lambda *_: done.set())  # after it is a clean exit too
    print(f"torch_cgx.collaborative: lighthouse at {server.address} "
          f"(peers pass initial_peers={server.address!r})", flush=True)  # fmt: skip
    done.wait()
    server.shutdown()


if __name__ == "__main__":
    main()
