"""Emulated multi-host runs on one machine: network namespaces, a bridge, rate-limited links.

    python -m benchmarks.hosts --hosts 2 --link 1gbit --check    # measure the links
    python -m benchmarks.allreduce --hosts 2 --link 1gbit -b 4M -e 16M --bits 4

Every emulated host is a network namespace with ``lo`` and one veth ``eth0``; the other ends of
the veths are ports of a Linux bridge living in its own namespace. Each host's link is limited to
``--link`` in both directions (a tbf qdisc on ``eth0``, the host's egress, and one on the bridge
port, the host's ingress); with ``--latency`` the hosts are TUN devices joined by a userspace
delay line instead (benchmarks/hosts_wan.py; one-way delay between two hosts = latency, this
kernel having no netem). Nothing is created in, and no address is used from, the caller's
namespace. Needs root and iproute2; see docs/hosts.md.

The code is in three modules, all re-exported here: hosts_net (namespaces, links, clean-up),
hosts_run (ranks on the hosts) and hosts_probe (link measurement).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import List, Optional, Sequence

from benchmarks.hosts_net import (  # noqa: F401  (the public names of this module)
    FRAME_OVER_PAYLOAD,
    HZ,
    MIN_BURST,
    Host,
    HostsUnavailable,
    _cmd,
    _netns_list,
    _root_links,
    _sh,
    _signals_deferred,
    _signals_raise,
    _teardown,
    check_prerequisites,
    cleanup_stale,
    emulated_hosts,
    format_rate,
    tbf_params,
)
from benchmarks.hosts_probe import measure_link
from benchmarks.hosts_run import (  # noqa: F401
    DEFAULT_PORT,
    HOST_ENV_MARK,
    _exit_code,
    _repo_root,
    _report_failure,
    _stop,
    any_hosts,
    rank_env,
    repo_pythonpath,
    run_on_hosts,
)
from torch_cgx.plan.rates import parse_rate_bits, parse_time  # noqa: F401  (the links' syntax)


def maybe_run_on_hosts(argv: Sequence[str], module: str) -> Optional[int]:
    """For a benchmark's main(): with `--hosts W --link RATE [--latency T]
    [--ranks-per-host K]` in argv, runs `python -m module <argv without them>` on W emulated
    hosts (K ranks each) and returns its exit code; without --hosts returns None (run
    normally). Missing prerequisites: the reason on stderr, 2."""
    rest, opts = [], {}
    it = iter(argv)
    for a in it:
        name, eq, value = a.partition("=")
        if name in ("--hosts", "--link", "--latency", "--ranks-per-host"):
            if not eq:
                value = next(it, None)
                if value is None or value.startswith("--"):
                    raise SystemExit(f"{name} needs a value")
            opts[name] = value
        else:
            rest.append(a)
    if "--hosts" not in opts:
        if opts:
            raise SystemExit(f"{' and '.join(opts)} need --hosts W (emulated hosts)")
        return None
    if "--link" not in opts:
        raise SystemExit("--hosts needs --link RATE (e.g. --link 1gbit): the emulated link speed")
    if os.environ.get(HOST_ENV_MARK):
        raise SystemExit("--hosts given inside an emulated host")
    try:
        world = int(opts["--hosts"])
        parse_rate_bits(opts["--link"])
        if "--latency" in opts:
            parse_time(opts["--latency"])
    except ValueError as e:
        raise SystemExit(f"--hosts/--link/--latency: {e}") from None
    if world < 1:
        raise SystemExit("--hosts needs W >= 1")
    per_host = opts.get("--ranks-per-host", "1")
    if not per_host.isdigit() or int(per_host) < 1:
        raise SystemExit(f"--ranks-per-host needs an integer >= 1, got {per_host!r}")
    try:
        check_prerequisites(latency="--latency" in opts)
    except HostsUnavailable as e:
        print(f"emulated hosts unavailable: {e.reason}", file=sys.stderr)
        return 2
    try:
        return run_on_hosts(
            world,
            opts["--link"],
            opts.get("--latency"),
            module,
            rest,
            ranks_per_host=int(per_host),
        )
    except HostsUnavailable as e:
        print(f"emulated hosts unavailable: {e.reason}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted: ranks killed, emulated hosts removed", file=sys.stderr)
        return 130


# ------------------------------------------------------------------------------------- CLI


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m benchmarks.hosts",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--hosts", type=int, default=2, help="emulated hosts (default 2)")
    p.add_argument("--link", default="1gbit", help="per-host link rate, tc syntax (1gbit)")
    p.add_argument("--latency", default=None, help="one-way delay between hosts (a TUN delay line)")
    p.add_argument("--check", action="store_true", help="measure host 0 <-> host 1 over TCP")
    p.add_argument("--bytes", default=None, help="bytes per direction (default: 64M, at most 2 s)")
    p.add_argument("--tolerance", type=float, default=0.15, help="allowed relative deviation")
    p.add_argument("--cleanup", action="store_true", help="remove namespaces of dead runs, exit")
    args = p.parse_args(argv)
    if args.cleanup:
        cleanup_stale()
        return 0
    try:
        rate = parse_rate_bits(args.link)
        if args.latency:
            parse_time(args.latency)
        check_prerequisites(latency=args.latency is not None)
    except ValueError as e:
        p.error(str(e))
    except HostsUnavailable as e:
        print(f"emulated hosts unavailable: {e.reason}", file=sys.stderr)
        return 2
    if args.check and args.hosts < 2:
        p.error("--check needs --hosts >= 2")
    if args.bytes:
        from benchmarks.sizes import parse_size

        nbytes = parse_size(args.bytes)
    else:
        nbytes = min(64 << 20, rate // 8 * 2)
    rc = 0
    try:
        with any_hosts(args.hosts, args.link, args.latency) as hosts:
            bp = tbf_params(rate)
            print(
                f"# {args.hosts} emulated hosts, link {format_rate(rate)} each way "
                f"(tbf burst {bp['burst']} B, limit {bp['limit']} B)"
                + (f", latency {args.latency} one-way" if args.latency else "")
            )
            for h in hosts:
                print(f"#   rank {h.rank}: netns {h.netns}, {h.ifname} {h.ip}")
            if args.check:
                for a, b in ((hosts[0], hosts[1]), (hosts[1], hosts[0])):
                    m = measure_link(a, b, nbytes)
                    dev = m["bits_per_s"] / rate - 1
                    good = abs(dev) <= args.tolerance
                    rc = rc or (0 if good else 1)
                    frames = m["bits_per_s"] * FRAME_OVER_PAYLOAD
                    print(
                        f"{a.ip} -> {b.ip}: {m['bits_per_s'] / 1e9:.3f} Gbit/s "
                        f"({dev:+.1%} vs {format_rate(rate)}; with headers "
                        f"{frames / 1e9:.3f} Gbit/s; {m['bytes'] >> 20} MiB), "
                        f"TCP rtt {m['rtt_us']:.0f} us" + ("" if good else "  <-- OFF"),
                        flush=True,
                    )
    except KeyboardInterrupt:
        print("interrupted: emulated hosts removed", file=sys.stderr)
        return 130
    return rc


if __name__ == "__main__":
    sys.exit(main())
