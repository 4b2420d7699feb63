"""Collaborative training on an emulated internet: torch_cgx.collaborative against hivemind
1.1.12, side by side in one run (docs/collaborative.md, "Measured").

    python -m benchmarks.collaborative --peers 4 --link 50mbit --latency 25ms --seconds 60
    python -m benchmarks.collaborative --systems cgx,hivemind --hivemind-python /path/to/python
    python -m benchmarks.collaborative --systems cgx-delay,hivemind-delay --hivemind-python ...

W peers, one per emulated host (benchmarks/hosts_wan.py: every link RATE both ways, LATENCY one
way); peer 1 computes ``--slow`` times slower (benchmarks/hosts_slow.py); peer W-1 is SIGKILLed a
third of the way in and restarted ``--down`` seconds later. Every peer first trains alone for
``--solo`` seconds (all at once, sharing the cores as they do later): the sum of those rates is
what the collaboration is measured against. Then the same model (a 1.06M-parameter MLP), data
and arguments (Adam, batch 32, target_batch_size, Float16, matchmaking_time, averaging_timeout)
go through each system for ``--seconds``. Printed per system: samples/s of the collaboration
(samples fed to ``step()`` by every peer, over the window) against the solo sum, epochs and the
mean time of one (over the window, and over its last third, when every peer is back), its
bound (the target batch's compute at the solo rates + a peer's mean bytes a round over the link +
the set latency), bytes sent per sample (every host's TUN, both systems' whole traffic), the
held-out loss at the end, and how long the restarted peer took to its first global step.
A system named with ``-delay`` runs with hivemind's ``delay_grad_averaging=True`` (and
``delay_optimizer_step``, hivemind's ``offload_optimizer`` as it requires): each round in the
background while the peer goes on computing; ``cgx-delay-wait`` adds ``wait_for_round=True`` (a
peer whose next share is done waits for the round, as hivemind's does). hivemind runs with
``--hivemind-python`` (an interpreter with ``hivemind==1.1.12``; it is never a dependency of
torch_cgx) and is left out, saying so, where none is given or found.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional

# "-delay": hivemind's delay_grad_averaging / delay_optimizer_step (rounds in the background)
SYSTEMS = ("cgx", "hivemind", "cgx-delay", "hivemind-delay", "cgx-delay-wait")


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.collaborative", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--peers", type=int, default=4)
    p.add_argument("--link", default="50mbit")
    p.add_argument("--latency", default="25ms")
    p.add_argument("--slow", type=float, default=3.0, help="peer 1's compute slowdown")
    p.add_argument("--seconds", type=float, default=60.0, help="the collaboration's window")
    p.add_argument("--solo", type=float, default=6.0, help="the solo phase (s)")
    p.add_argument("--down", type=float, default=3.0, help="seconds the killed peer stays down")
    p.add_argument("--target", type=int, default=256)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--compression", default="fp16", choices=("fp16", "none", "maxmin4"))
    p.add_argument("--matchmaking-time", type=float, default=3.0)
    p.add_argument("--averaging-timeout", type=float, default=10.0)
    p.add_argument("--systems", default="cgx,hivemind")
    p.add_argument("--hivemind-python", default=None)
    p.add_argument(
        "--keep-cwnd",
        action="store_true",
        help="net.ipv4.tcp_slow_start_after_idle=0 on every host (both systems)",
    )
    p.add_argument("--json", default=None, help="write the figures here")
    p.add_argument("--plot", default=None, help="a PNG of loss and steps against time")
    # one peer (inside an emulated host; the driver passes these)
    for name in ("--peer", "--system", "--name", "--out", "--ip"):
        p.add_argument(name, default=None, help=argparse.SUPPRESS)
    for name in ("--index", "--seed"):
        p.add_argument(name, type=int, default=0, help=argparse.SUPPRESS)
    for name in ("--join-at", "--end"):
        p.add_argument(name, type=float, default=0.0, help=argparse.SUPPRESS)
    return p


def _hivemind_python(given: Optional[str]) -> Optional[str]:
    for python in ([given] if given else []) + [sys.executable]:
        ok = subprocess.run([python, "-c", "import hivemind"], capture_output=True).returncode
        if ok == 0:
            return python
    return None


def _tx_bytes(host) -> int:
    from benchmarks.hosts_net import _cmd

    out = _cmd("ip", "netns", "exec", host.netns, "cat", "/proc/net/dev").stdout
    for line in out.splitlines():
        if line.strip().startswith("eth0:"):
            return int(line.split(":", 1)[1].split()[8])
    return 0


def _keep_cwnd(hosts) -> None:
    """TCP keeps its window across idle periods (Linux resets it after an idle RTO by
    default: every round then starts in slow start)."""
    from benchmarks.hosts_net import _cmd

    for h in hosts:
        _cmd("ip", "netns", "exec", h.netns, "sysctl", "-qw",
             "net.ipv4.tcp_slow_start_after_idle=0")  # fmt: skip


def _start(args, python, system, host, index, name, join_at, end, out):
    from benchmarks.hosts_run import repo_pythonpath

    slow = str(args.slow if index == 1 else 1.0)
    env = dict(os.environ, PYTHONPATH=repo_pythonpath(dict(os.environ)), GLOO_SOCKET_IFNAME="eth0",
               OMP_NUM_THREADS="1", CGX_HOST_SLOWDOWN=slow)  # fmt: skip
    cmd = ["ip", "netns", "exec", host.netns, python, "-m", "benchmarks.collaborative",
           "--peer", "1", "--system", system, "--name", name, "--out", out, "--ip", host.ip,
           "--index", str(index), "--join-at", str(join_at), "--end", str(end)]  # fmt: skip
    for key in ("target", "batch", "compression", "matchmaking_time", "averaging_timeout"):
        cmd += [f"--{key.replace('_', '-')}", str(getattr(args, key))]
    log = open(os.path.join(out, f"{system}-{name}.log"), "w")
    return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT,
                            start_new_session=True)  # fmt: skip


def _run_system(args, system: str, python: str, hosts, out: str) -> Dict:
    t0 = time.time() + 8.0  # the imports
    join_at, end = t0 + args.solo, t0 + args.solo + args.seconds
    before = [_tx_bytes(h) for h in hosts]
    procs = {f"p{i}": _start(args, python, system, h, i, f"p{i}", join_at, end, out)
             for i, h in enumerate(hosts)}  # fmt: skip
    victim = f"p{len(hosts) - 1}"
    time.sleep(max(0.0, join_at + args.seconds / 3 - time.time()))
    _kill(procs[victim])
    killed = time.time()
    time.sleep(args.down)
    restarted = time.time()
    procs[victim + "r"] = _start(args, python, system, hosts[-1], len(hosts) - 1, victim + "r",
                                 0.0, end, out)  # fmt: skip
    procs["p0"].wait(timeout=end - time.time() + 120)
    time.sleep(1.0)
    for p in procs.values():
        _kill(p)
    sent = sum(_tx_bytes(h) - b for h, b in zip(hosts, before))
    figures = _figures(system, out, procs, sent, join_at, end, killed, restarted)
    figures["bound_s"] = _bound(args, figures, sent)
    return figures


def _bound(args, figures: Dict, sent: int) -> Optional[float]:
    """An epoch's bound: the target batch's compute at the peers' solo rates, one peer's mean
    bytes a round (every host's traffic / epochs / peers) over the link, the set latency."""
    from torch_cgx.plan.rates import parse_rate_bits, parse_time

    if not figures["solo_sum"] or not figures["epochs"]:
        return None
    latency = parse_time(args.latency) if args.latency else 0.0
    link = parse_rate_bits(args.link) / 8
    per_round = sent / figures["epochs"] / args.peers
    return args.target / figures["solo_sum"] + per_round / link + latency


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL a peer and every process it forked (hivemind's DHT and averager are processes
    of their own, in the peer's session): none outlives its run to load the next."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _rows(out, system, name) -> List[dict]:
    path = os.path.join(out, f"{system}-{name}.jsonl")
    if not os.path.exists(path):
        return []
    return [json.loads(line) for line in open(path) if line.strip()]


def _figures(system, out, procs, sent, join_at, end, killed, restarted) -> Dict:
    rows = {name: _rows(out, system, name) for name in procs}
    solo = sum(r[0]["solo"] or 0 for n, r in rows.items() if r and not n.endswith("r"))
    samples = 0
    for r in rows.values():
        epochs = [x for x in r if x["event"] in ("epoch", "end")]
        samples += epochs[-1]["samples"] if epochs else 0
    p0 = [x for x in rows["p0"] if x["event"] == "epoch"]
    end_row = next((x for x in rows["p0"] if x["event"] == "end"), {})
    back = [x for x in rows[[n for n in procs if n.endswith("r")][0]] if x["event"] == "epoch"]
    window = end - join_at
    losses = [x for x in rows["p0"] if x["event"] == "loss"]
    curves = {"loss": [(x["time"] - join_at, x["loss"]) for x in losses],
              "epochs": [(x["time"] - join_at, x["epoch"]) for x in p0]}  # fmt: skip
    span = p0[-1]["time"] - p0[0]["time"] if len(p0) > 1 else None
    late = [x["time"] for x in p0 if x["time"] >= join_at + window * 2 / 3]  # all peers back
    return {
        "system": system, "samples_per_s": samples / window, "solo_sum": solo,
        "of_solo": samples / window / solo if solo else None, "epochs": len(p0),
        "epoch_s": span / (len(p0) - 1) if span else None,
        "late_epoch_s": (late[-1] - late[0]) / (len(late) - 1) if len(late) > 1 else None,
        "bytes_per_sample": sent / samples if samples else None, "loss": end_row.get("loss"),
        "rejoin_s": back[0]["time"] - restarted if back else None, "down_s": restarted - killed,
        "curves": curves,
    }  # fmt: skip


def _print(results: List[Dict], args) -> None:
    print(f"{args.peers} peers, {args.link} links, {args.latency} one way, peer 1 {args.slow}x "
          f"slower, peer {args.peers - 1} killed and restarted; target {args.target}, batch "
          f"{args.batch}, {args.compression}, {args.seconds:.0f} s")  # fmt: skip
    print(f"{'system':<15}{'samples/s':>10}{'of solo':>9}{'epochs':>8}{'s/epoch':>9}"
          f"{'late s/ep':>10}{'bound s':>9}{'B/sample':>10}{'loss':>8}"
          f"{'rejoin s':>10}")  # fmt: skip

    def f(r, key, fmt):
        return format(r[key], fmt) if r[key] is not None else "-"

    for r in results:
        print(f"{r['system']:<15}{f(r, 'samples_per_s', '.0f'):>10}{f(r, 'of_solo', '.2f'):>9}"
              f"{r['epochs']:>8}{f(r, 'epoch_s', '.2f'):>9}{f(r, 'late_epoch_s', '.2f'):>10}"
              f"{f(r, 'bound_s', '.2f'):>9}"
              f"{f(r, 'bytes_per_sample', '.0f'):>10}"
              f"{f(r, 'loss', '.4f'):>8}{f(r, 'rejoin_s', '.1f'):>10}")  # fmt: skip
    by = {r["system"]: r for r in results if r["samples_per_s"]}
    for mode in ("", "-delay"):
        a, b = by.get("cgx" + mode), by.get("hivemind" + mode)
        if a and b:
            print(f"{a['system']} / {b['system']}: {a['samples_per_s'] / b['samples_per_s']:.2f}x "
                  f"samples/s, {b['bytes_per_sample'] / a['bytes_per_sample']:.2f}x fewer bytes "
                  "per sample")  # fmt: skip


def main(argv: Optional[List[str]] = None) -> int:
    args = _parser().parse_args(argv)
    if args.peer:
        from benchmarks.collaborative_run import run_peer

        run_peer(args)
        return 0
    from benchmarks.hosts_net import HostsUnavailable, check_prerequisites
    from benchmarks.hosts_run import any_hosts

    systems = [s for s in args.systems.split(",") if s]
    if not systems or any(s not in SYSTEMS for s in systems):
        raise SystemExit(f"--systems: a comma-separated subset of {','.join(SYSTEMS)}")
    try:
        check_prerequisites(latency=True)
    except HostsUnavailable as e:
        print(f"emulated hosts unavailable: {e.reason}", file=sys.stderr)
        return 2
    results, out = [], tempfile.mkdtemp(prefix="cgx-collab-")
    try:
        for system in systems:
            python = sys.executable
            if system.startswith("hivemind"):
                python = _hivemind_python(args.hivemind_python)
                if python is None:
                    print("hivemind: not installed for any given Python (pip install "
                          "hivemind==1.1.12; --hivemind-python): left out")  # fmt: skip
                    continue
            with any_hosts(args.peers, args.link, args.latency) as hosts:
                if args.keep_cwnd:
                    _keep_cwnd(hosts)
                results.append(_run_system(args, system, python, hosts, out))
    finally:
        shutil.rmtree(out, ignore_errors=True) if not os.environ.get("CGX_KEEP") else print(out)
    _print(results, args)
    if args.plot and results:
        from benchmarks.plots import plot_collaborative

        title = f"{args.peers} peers, {args.link}, {args.latency} one way, {args.compression}"
        plot_collaborative({r["system"]: r["curves"] for r in results}, args.plot, title)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "results": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
