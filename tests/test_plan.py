"""The planner (torch_cgx.plan): decisions on synthetic costs where the math puts the break-even
points, budgets, plan files (JSON and HiPress's format) read back to pin decisions, and the
codec calibration's cache and fallbacks."""

from __future__ import annotations

import json
import math

import pytest

from torch_cgx import plan as P
from torch_cgx.plan import planner
from torch_cgx.plan.costs import CompressorCosts, Linear, LinkCosts, compressor_key, parse_rate

KEY = compressor_key("maxmin", {"bits": 4, "bucket_size": 512})


def synthetic(fixed=20e-6, per_value=0.0):
    """Codec costs for max-min 4-bit with a known fixed cost per encode / decode call."""
    lin = Linear(fixed, per_value)
    return CompressorCosts({KEY: lin}, {KEY: lin}, add=Linear(0.0, 0.0), call=0.0)


def sra_only(monkeypatch):
    monkeypatch.setattr(planner, "SEGMENTS", (1,))
    monkeypatch.setattr(planner, "ALGORITHMS", ("sra",))
    monkeypatch.setattr(planner, "MARGIN", 1.0)


@pytest.mark.parametrize("world", [2, 4])
def test_break_even_where_the_math_puts_it(monkeypatch, world):
    """Exact: 2 (W - 1) messages of 4 m bytes (m = n / W). SRA at 4 bits: the same number of
    messages of P(m) = 24 + 8 m / 512 + m / 2 bytes, and W encodes + 2W - 1 decodes of fixed
    cost f (a planned call agrees on nothing). Equal when
    2 (W - 1) (4 m - P(m)) / beta = (3W - 1) f."""
    sra_only(monkeypatch)
    link, f = LinkCosts(parse_rate("1gbit"), 50e-6), 20e-6
    host = synthetic(f)
    budget = P.Budget(compressors=("maxmin:bits=4,bucket_size=512",))
    extra = (3 * world - 1) * f
    # 4 m - (24 + m / 64 + m / 2) = extra * beta / (2 (W - 1)), m a multiple of 512
    m = (extra * link.bandwidth / (2 * (world - 1)) + 24) / (4 - 1 / 64 - 0.5)
    m_star = math.ceil(m / 512) * 512
    below, above = (m_star - 512) * world, (m_star + 512) * world
    assert P.choose(below, world, link, host, budget)[0].exact
    assert not P.choose(above, world, link, host, budget)[0].exact


def test_slow_links_take_fewer_bits_and_fast_links_stay_exact():
    link_slow = LinkCosts(parse_rate("100mbit"), 50e-6)
    link_fast = LinkCosts(parse_rate("400gbit"), 2e-6)
    keys = planner.compressors_of(P.Budget(min_bits=2))
    lin = Linear(3e-6, 0.3e-9)  # about this machine's max-min: 0.3 ns a value
    cheap = CompressorCosts({compressor_key(n, p): lin for n, p in keys},
                       {compressor_key(n, p): lin for n, p in keys})  # fmt: skip
    opt, t, exact = P.choose(1 << 22, 4, link_slow, cheap, P.Budget(min_bits=2))
    assert dict(opt.params)["bits"] == 2 and t < exact / 5
    opt, _, _ = P.choose(1 << 22, 4, link_fast, cheap, P.Budget(min_bits=2))
    assert opt.exact  # the codec costs more than the bytes it saves
    opt, _, _ = P.choose(1 << 22, 4, link_slow, cheap, P.Budget(min_bits=6))
    assert dict(opt.params)["bits"] == 6  # never below the budget
    # Latency-bound at W = 2: every path sends 2 messages, so the codec's cost (9 us) against the
    # bytes it saves (2 x 340 B: 5.4 us at 1 Gbit/s) decides. (At W = 4 a tree's 4 messages beat
    # the ring's 6, and the planner may quantize even tiny tensors.)
    link_1g = LinkCosts(parse_rate("1gbit"), 50e-6)
    assert P.choose(100, 2, link_1g, cheap, P.Budget(min_bits=2))[0].exact


def test_pipeline_segments_pay_when_codec_and_wire_are_comparable():
    """The two-stage pipeline's formula: k max(C, M) + min(C, M) against C + M."""
    link = LinkCosts(parse_rate("1gbit"), 20e-6)
    host = synthetic(2e-6, 4e-9)  # 4 ns a value: as slow as the 4-bit wire
    opt = P.Option("maxmin", (("bits", 4), ("bucket_size", 512)), "sra", 0)
    n = 1 << 24  # 64 MiB: 16 segments of the backend's 4 MiB
    piped = P.predict(opt, n, 2, link, host)
    one = P.predict(P.Option(opt.compressor, opt.params, "sra", 1), n, 2, link, host)
    assert piped < 0.75 * one


def test_every_dense_path_pipelines_and_sparse_ones_only_when_asked():
    """CaSync in the model as in the backend (lanes.cc): ring, tree and dense allgather run the
    default pipeline above one segment; a sparse compressor's allgather only with explicit
    segments; the plan file's partitions follow."""
    link = LinkCosts(parse_rate("1gbit"), 20e-6)
    host = synthetic(2e-6, 4e-9)
    params = (("bits", 4), ("bucket_size", 512))
    n = 1 << 24
    for alg in ("ring", "tree", "allgather"):
        piped = P.predict(P.Option("maxmin", params, alg, 0), n, 2, link, host)
        one = P.predict(P.Option("maxmin", params, alg, 1), n, 2, link, host)
        assert piped < 0.8 * one, alg
    topk = compressor_key("topk", {})
    host.encode[topk] = host.decode[topk] = Linear(2e-6, 4e-9)
    default = P.predict(P.Option("topk", (), "sra", 0), n, 2, link, host)
    assert default == P.predict(P.Option("topk", (), "sra", 1), n, 2, link, host)
    assert P.predict(P.Option("topk", (), "sra", 16), n, 2, link, host) < default
    ring = planner.Decision("g", n, P.Option("maxmin", params, "ring", 0), 0.0, 0.0)
    sparse = planner.Decision("g", n, P.Option("topk", (), "sra", 0), 0.0, 0.0)
    assert (ring.partitions, sparse.partitions) == (16, 1)


def test_probe_correction_interpolates_in_log_size():
    """The probe's measured / predicted ratios: exact at the probed sizes, linear in log2(n)
    between them, held beyond; bad points are refused; JSON round trip."""
    from torch_cgx.plan.costs import Correction

    c = Correction(((1 << 10, 2.0), (1 << 14, 1.0), (1 << 20, 1.6)))
    assert (c(1 << 10), c(1 << 14), c(1 << 20)) == (2.0, 1.0, 1.6)
    assert c(1 << 12) == pytest.approx(1.5) and c(1 << 17) == pytest.approx(1.3)
    assert c(1) == 2.0 and c(1 << 30) == 1.6
    for bad in ((), ((8, 1.0), (8, 2.0)), ((8, 0.0),), ((8, float("nan")),), ((0, 1.0),)):
        with pytest.raises(ValueError, match="correction"):
            Correction(bad)
    host = synthetic()
    host.paths = {"sra": c, "exact": Correction(((4, 1.25),))}
    back = CompressorCosts.from_json(json.loads(json.dumps(host.to_json())))
    assert back.paths == host.paths
    opt = P.Option("maxmin", (("bits", 4), ("bucket_size", 512)), "sra", 0)
    link = LinkCosts(parse_rate("1gbit"), 50e-6)
    bare = P.predict(opt, 1 << 12, 2, link, synthetic())
    call = synthetic().call
    assert P.predict(opt, 1 << 12, 2, link, back) - call == pytest.approx((bare - call) * 1.5)


def test_contest_takes_the_close_options_of_distinct_paths(monkeypatch):
    """The contest: per size class, the best option of each path predicted within CONTEST of the
    fastest (at most CONTEST_MAX, fastest first); none where one path wins clearly, none above
    CONTEST_NUMEL; its winners override the model's choice in the rules."""
    from torch_cgx.plan import auto, probe

    link = LinkCosts(parse_rate("1gbit"), 50e-6)
    host = synthetic(20e-6, 0.3e-9)
    budget = P.Budget(compressors=("maxmin:bits=4,bucket_size=512",))
    contests = dict(probe.contested(4, link, host, budget, auto.SIZE_CLASSES))
    assert contests and max(contests) <= probe.CONTEST_NUMEL
    for n, opts in contests.items():
        times = [P.predict(o, n, 4, link, host) for o in opts]
        assert 2 <= len(opts) <= probe.CONTEST_MAX and times == sorted(times)
        assert times[-1] <= probe.CONTEST * times[0]
        assert len({(o.exact, o.algorithm, o.segments) for o in opts}) == len(opts)
    n, opts = next(iter(contests.items()))
    loser = opts[-1]
    rules = auto.rules_for(4, link, host, budget, {n: loser})
    rule = next(r for r in rules if n <= r["max_numel"])
    assert (rule["compressor"] or None, rule["algorithm"]) == (loser.compressor, loser.algorithm)
    assert probe.option_from(json.loads(json.dumps(probe.option_to(loser)))) == loser
    # Above CONTEST_NUMEL the codec and algorithm timed fastest at CONTEST_NUMEL stay (with the
    # model's best segments for them) where the model predicts them within CONTEST of its own
    # choice (and only there).
    kept = set()
    every = planner.options(budget, measured=True)
    for w in every:
        rules = auto.rules_for(4, link, host, budget, {probe.CONTEST_NUMEL: w})
        for m in (probe.CONTEST_NUMEL * 4, 1 << 30):
            rule = next(r for r in rules if m <= r["max_numel"])
            got = (rule["compressor"] or None, rule["algorithm"], rule["segments"])
            best, t, _ = planner.choose(m, 4, link, host, budget)
            same = [o for o in every if (o.compressor, o.algorithm) == (w.compressor, w.algorithm)]
            path_t, path_best = min(
                ((P.predict(o, m, 4, link, host), o) for o in same), key=lambda p: p[0]
            )
            close = path_t <= probe.CONTEST * t
            want = path_best if close else best
            assert got == (want.compressor, want.algorithm, want.segments), (w, m)
            kept.add(close)
    assert kept == {True, False}  # both cases occurred
    # What the contest times is what it names: an unpipelined candidate runs with no pipeline.
    from torch_cgx.config import CGXConfig

    params = (("bits", 4), ("bucket_size", 512))
    for segments, want in ((0, 4 << 20), (1, 0)):
        native = probe._native_of(CGXConfig(), P.Option("maxmin", params, "ring", segments))
        assert (native.pipeline_segment_bytes, native.bits, native.algorithm) == (want, 4, 1)
    native = probe._native_of(CGXConfig(), P.Option("topk", (("ratio", 0.05),), "allgather"))
    assert (native.compressor, dict(native.compressor_params)) == ("topk", {"ratio": 0.05})
    # At W = 8 on a slow link SRA sends 1.75 payloads of the tensor, the tree 6: no contest.
    monkeypatch.setattr(planner, "ALGORITHMS", ("sra", "tree"))
    slow = LinkCosts(parse_rate("10mbit"), 50e-6)
    assert probe.contested(8, slow, host, budget, [1 << 20]) == []


def test_contest_adds_the_first_codec_where_the_model_prefers_another():
    """Where the model puts another codec first on a path (8 bits, cheap to encode, before
    4 bits on a fast link), the budget's first codec on that path joins the contest, within
    CONTEST_MAX and CONTEST of the fastest."""
    from torch_cgx.plan import auto, probe

    k8 = compressor_key("maxmin", {"bits": 8, "bucket_size": 512})
    slow, fast = Linear(20e-6, 0.7e-9), Linear(20e-6, 0.6e-9)
    host = CompressorCosts(
        {KEY: slow, k8: fast}, {KEY: slow, k8: fast}, add=Linear(0.0, 0.0), call=0.0
    )
    budget = P.Budget(
        compressors=("maxmin:bits=4,bucket_size=512", "maxmin:bits=8,bucket_size=512")
    )
    link = LinkCosts(parse_rate("10gbit"), 20e-6)
    added = 0
    for n, opts in probe.contested(2, link, host, budget, auto.SIZE_CLASSES):
        times = [P.predict(o, n, 2, link, host) for o in opts]
        assert 2 <= len(opts) <= probe.CONTEST_MAX + 1 and max(times) <= probe.CONTEST * min(times)
        assert len(set(opts)) == len(opts)
        for o in opts:
            if dict(o.params).get("bits") == 8:
                same = [p for p in opts if (p.algorithm, p.segments) == (o.algorithm, o.segments)]
                added += any(dict(p.params).get("bits") == 4 for p in same)
    assert added  # the 4-bit twin of an 8-bit choice was timed somewhere


def test_budget_rounds():
    """The probe and the contest time at least their floor of rounds, more where a round is
    short: as many as fit the budget, never more than the cap."""
    from torch_cgx.plan import probe

    assert probe.budget_rounds(7, 10_000, 0.25, 61) == 25  # 10 ms rounds in 0.25 s
    assert probe.budget_rounds(7, 100_000, 0.25, 61) == 7  # long rounds: the floor
    assert probe.budget_rounds(7, 1_000, 0.25, 61) == 61  # short rounds: the cap
    assert probe.budget_rounds(15, 0, 0.25, 61) == 61  # an immeasurably short round
    assert probe.budget_rounds(15, 1_000, 0.0, 61) == 15  # no budget: the floor
    for us in range(1, 300_000, 997):
        r = probe.budget_rounds(7, us, 0.25, 61)
        assert 7 <= r <= 61 and (r in (7, 61) or r * us <= 250_000 < (r + 1) * us)


def test_contest_verdict_needs_paired_wins_off_the_default_path():
    """pick_winner: the best handicapped median, but an option off the default path (exact,
    then SRA) must also beat the best more-default option in CONTEST_PAIRED of the rounds."""
    from torch_cgx.plan import probe

    q = (("bits", 4), ("bucket_size", 512))
    exact, sra = P.Option(), P.Option("maxmin", q, "sra")
    ring, tree = P.Option("maxmin", q, "ring"), P.Option("maxmin", q, "tree")
    flat = [1.0] * 15
    steady = [0.9] * 15  # faster in every round
    lucky = [0.9] * 8 + [1.2] * 7  # the better median, faster in 8 of 15 rounds only
    assert 8 < probe.CONTEST_PAIRED * 15 <= 15
    assert probe.pick_winner([sra, ring], [flat, steady]) == ring
    assert probe.pick_winner([sra, ring], [flat, lucky]) == sra
    assert probe.pick_winner([ring, sra], [lucky, flat]) == sra  # order does not matter
    assert probe.pick_winner([exact, sra], [flat, lucky]) == exact
    assert probe.pick_winner([exact, sra], [flat, steady]) == sra
    # A chain: ring falls back to SRA, which beats exact in every round.
    assert probe.pick_winner([exact, sra, ring], [[1.2] * 15, flat, lucky]) == sra
    # ... and to exact where SRA does not either.
    assert probe.pick_winner([exact, sra, ring], [flat, lucky, [0.85] * 8 + [1.3] * 7]) == exact
    # No default-path option: the best median.
    assert probe.pick_winner([ring, tree], [flat, lucky]) == tree
    # The handicaps stay: ring 2 % faster in every round is not enough (ALGORITHM_MARGIN).
    assert probe.pick_winner([sra, ring], [flat, [0.98] * 15]) == sra


def test_codec_and_wire_factors_from_two_settings():
    """solve_split recovers the codec and wire factors from two settings of different mix, in
    either pipeline regime, refuses mixes too alike to tell apart; predictions then scale each
    term by its own factor (and JSON keeps the split)."""
    from torch_cgx.plan.costs import Correction
    from torch_cgx.plan.model import formula_parts
    from torch_cgx.plan.probe import solve_split

    def time_of(a, b, c, m, k):
        return k * max(a * c, b * m) + min(a * c, b * m) if k > 1 else a * c + b * m

    for a, b in ((2.0, 0.8), (0.5, 1.5), (1.2, 1.2)):
        for k in (1, 4):
            obs = [(time_of(a, b, c, m, k), (c, m), k) for c, m in ((3e-3, 1e-3), (1e-3, 4e-3))]
            assert solve_split(obs) == pytest.approx((a, b), rel=1e-6), (a, b, k)
    same_mix = [(time_of(2, 1, c, m, 1), (c, m), 1) for c, m in ((1e-3, 2e-3), (2e-3, 4e-3))]
    assert solve_split(same_mix) is None
    corr = Correction(((1 << 10, 1.5), (1 << 20, 1.0)), ((1 << 10, 3.0, 1.0), (1 << 20, 1.0, 1.0)))
    assert corr.factors(1 << 15) == pytest.approx((2.0, 1.0)) and corr(1 << 15) == 1.25
    assert Correction(((8, 2.0),)).factors(100) == (2.0, 2.0)
    assert Correction.from_json(json.loads(json.dumps(corr.to_json()))) == corr
    link, host = LinkCosts(parse_rate("1gbit"), 50e-6), synthetic(2e-6, 4e-9)
    opt = P.Option("maxmin", (("bits", 4), ("bucket_size", 512)), "sra", 1)
    _, (c, m), _ = formula_parts(opt, 1 << 15, 2, link, host)
    host.paths = {"sra": corr}
    assert P.predict(opt, 1 << 15, 2, link, host) == pytest.approx(host.call + 2 * c + m)


def test_budget_parsing():
    assert P.Budget.parse("bits>=2").min_bits == 2
    assert [b for _, p in P.Budget.parse("6").allowed() for b in [p.get("bits")]][:3] == [
        6,
        7,
        8,
    ]
    b = P.Budget.parse("topk:ratio=0.01,maxmin:bits=2,bucket_size=64")
    assert b.allowed() == [
        ("topk", {"ratio": 0.01}),
        ("maxmin", {"bits": 2, "bucket_size": 64}),
    ]
    with pytest.raises(ValueError, match="unknown compressor"):
        P.Budget.parse("zip:level=3")
    with pytest.raises(ValueError, match="name=value"):
        P.Budget.parse("topk:ratio")
    with pytest.raises(ValueError, match="min_bits"):
        P.Budget(min_bits=0)
    with pytest.raises(ValueError, match="not a rate"):
        LinkCosts.parse("fast")


def test_plan_files_round_trip_and_pin(tmp_path):
    from torch_cgx.plan.__main__ import main

    js, hp = tmp_path / "plan.json", tmp_path / "SeCoPaPlan.txt"
    args = ["--world", "2", "--link", "100mbit", "--n-layer", "2", "--n-embd", "64",
            "--vocab", "300", "--n-positions", "64", "--quiet"]  # fmt: skip
    assert main(args + ["--json", str(js), "--hipress", str(hp)]) == 0
    data = json.loads(js.read_text())
    lines = hp.read_text().splitlines()
    assert len(lines) == len(data["gradients"]) == 2 + 2 * 12 + 2
    for line, g in zip(lines, data["gradients"]):
        gid, comp, parts = map(int, line.split())
        assert (gid, bool(comp), parts) == (g["id"], g["compress"], g["partitions"])
        big_sra = g["compress"] and g["option"]["algorithm"] == "sra" and g["numel"] > 1 << 20
        assert parts == (-(-4 * g["numel"] // (4 << 20)) if big_sra else 1) or not big_sra
    assert any(g["compress"] for g in data["gradients"])  # 100 Mbit/s: the big ones compress
    assert not all(g["compress"] for g in data["gradients"])
    # Pinned: the decisions of the file are kept whatever the new link says.
    pins = P.read_pins(str(js))
    sizes = [(g["name"], g["numel"]) for g in data["gradients"]]
    host = P.calibrate(planner.compressors_of(P.Budget(), pins.values()))
    fast = P.plan_gradients(sizes, 2, LinkCosts.parse("400gbit", "1us"), host, P.Budget(), pins)
    assert all(d.pinned and d.option == pins[d.name] for d in fast.decisions)
    bad = tmp_path / "bad.json"
    bad.write_text('{"gradients": [{"name": "x"}]}')
    with pytest.raises(ValueError, match="not a torch_cgx plan file"):
        P.read_pins(str(bad))


def test_calibration_cache_and_fallbacks(tmp_path, monkeypatch):
    from torch_cgx.plan import costs

    keys = [("maxmin", {"bits": 4, "bucket_size": 512}), ("fp16", {})]
    path = str(tmp_path / "cache" / "codec.json")
    first = costs.calibrate(keys, path=path)
    assert set(first.encode) == {compressor_key(n, p) for n, p in keys}
    assert all(v.per_value > 0 for v in first.encode.values())  # bigger inputs take longer

    def no_measuring(*a, **k):
        raise AssertionError("measured although cached")

    monkeypatch.setattr(costs, "measure_compressors", no_measuring)
    assert costs.calibrate(keys, path=path).to_json() == first.to_json()  # from the cache
    monkeypatch.undo()
    with open(path, "w") as f:
        f.write("{ not json")  # a corrupt cache is measured again and rewritten
    again = costs.calibrate(keys, path=path)
    assert set(again.encode) == set(first.encode)
    assert json.load(open(path))["encode"].keys() == again.encode.keys()
    blocked = tmp_path / "file"
    blocked.write_text("")
    unwritable = costs.calibrate(keys, path=str(blocked / "sub" / "codec.json"))
    assert set(unwritable.encode) == set(first.encode)  # measured, not cached, no error


def test_rules_cover_every_size_and_merge_neighbours():
    from torch_cgx.plan import auto

    link = LinkCosts(parse_rate("1gbit"), 50e-6)
    keys = planner.compressors_of(P.Budget(min_bits=4))
    lin = Linear(3e-6, 0.3e-9)
    host = CompressorCosts({compressor_key(n, p): lin for n, p in keys},
                      {compressor_key(n, p): lin for n, p in keys})  # fmt: skip
    rules = auto.rules_for(2, link, host, P.Budget(min_bits=4))
    bounds = [r["max_numel"] for r in rules]
    assert bounds == sorted(bounds) and bounds[-1] == 1 << 62
    assert rules[0]["compressor"] == ""  # small: exact
    assert rules[-1]["compressor"] == "maxmin"  # large on 1 Gbit/s: compressed
    for a, b in zip(rules, rules[1:]):  # neighbours differ, or they would be one rule
        assert {k: v for k, v in a.items() if k != "max_numel"} != {
            k: v for k, v in b.items() if k != "max_numel"
        }
    for n in auto.SIZE_CLASSES:  # each class gets its own decision
        rule = next(r for r in rules if n <= r["max_numel"])
        opt = P.choose(n, 2, link, host, P.Budget(min_bits=4))[0]
        assert rule["compressor"] == (opt.compressor or "") and rule["segments"] == opt.segments
