"""The DiLoCo integrations on torchft (``manager=``): replica groups as real processes, each its
own torch.distributed world of one rank, a Lighthouse on 127.0.0.1 in the test.

accelerate: two replicas train through ``AccelerateDiLoCo``; both save the integration's state
into one folder at the second sync (the files are keyed by replica id, not by the rank both
have); replica 1 SIGKILLs itself in the middle of its third sync, is started again, loads its
own file (its inner optimizer's state), heals at its first sync (DiLoCo's state and the
parameters from replica 0), and from then on both hold bitwise the same synced parameters,
global copies, outer-optimizer state and DiLoCo step. Trainer: ``attach_diloco`` with a manager,
two replicas on their own data, differ between syncs and agree bitwise after each.
In one process: what is refused. The workers: tests/diloco_integrations_ft_replica.py."""

from __future__ import annotations

import importlib.util
import os
import signal
import types

import pytest
import torch
import torch.multiprocessing as mp
from dist_helpers import context_start_method

# Not imported here: torchft imports triton, which must first be imported by the Triton tests'
# modules under TRITON_INTERPRET=1 (collection imports every module before any test runs).
if importlib.util.find_spec("torchft") is None:  # installed by install-deps; a pinned skip
    pytest.skip("torchft is not installed (requirements-dev.txt)", allow_module_level=True)

import diloco_integrations_ft_replica as worker  # noqa: E402
from torchft_testing import LIMIT, Replicas, _equal  # noqa: E402

NEEDED = ("transformers", "accelerate")
pytestmark = pytest.mark.skipif(
    any(importlib.util.find_spec(m) is None for m in NEEDED),
    reason="transformers and accelerate are needed (requirements-dev.txt)",
)


class AccelerateReplicas(Replicas):
    """test_diloco_torchft's replica bookkeeping, the processes running worker.accelerate."""

    def __init__(self, out, lighthouse):
        super().__init__(out, lighthouse, None, None, False)

    def start(self, name: str, kill_at: int = 0, resume: bool = False):
        args = (self.out, self.args[0], name, kill_at, 2, resume)  # both save at sync 2
        self.procs[name] = self.ctx.Process(target=worker.accelerate, args=args, daemon=True)
        self.procs[name].start()

    def up(self, name: str) -> dict:
        folder = os.path.join(self.out, name)
        ups = (
            [f for f in os.listdir(folder) if f.startswith("up.") and not f.endswith(".tmp")]
            if os.path.isdir(folder)
            else []
        )
        return torch.load(os.path.join(folder, ups[0])) if ups else None


def _kill_and_restart(replicas):
    """r0 and r1 start; r1 dies in its third sync; started again, it resumes from its file."""
    replicas.start("r0")
    replicas.start("r1", kill_at=3)
    replicas.wait("two replicas up", lambda: replicas.up("r0") and replicas.up("r1"))
    open(os.path.join(replicas.out, "go"), "w").close()
    replicas.procs["r1"].join(LIMIT)
    assert replicas.procs["r1"].exitcode == -signal.SIGKILL
    assert replicas.steps("r1") == [1, 2], replicas.steps("r1")
    files = sorted(os.listdir(os.path.join(replicas.out, "ckpt")))
    assert files == ["diloco-r0-rank0.pt", "diloco-r1-rank0.pt"], files  # no collision
    before = replicas.load("r1", 2)
    os.rename(os.path.join(replicas.out, "r1"), os.path.join(replicas.out, "r1.killed"))
    replicas.start("r1", resume=True)
    return before


@pytest.mark.timeout(240)
def test_accelerate_replica_killed_resumes_heals_and_agrees(tmp_path, lighthouse):
    replicas = AccelerateReplicas(tmp_path, lighthouse)
    try:
        before = _kill_and_restart(replicas)
        replicas.wait("r1's first sync after the restart", lambda: replicas.steps("r1"))
        up = replicas.up("r1")  # its own file: the loop's step and its inner optimizer's state
        assert up == {"loop_step": 8, "adam": 8.0}, up
        first = min(replicas.steps("r1"))
        healed = replicas.load("r1", first)
        # the heal: DiLoCo's step and state are r0's (r0 trained on through the failed sync),
        # the loop's step and the inner optimizer's state stay r1's own
        assert healed["healed"] and first == 3, (first, healed["healed"])
        assert healed["step"] == 16 and healed["loop_step"] == healed["adam"] == 12, healed
        assert healed["metrics"]["diloco/step"] == 16
        assert all(float(r.abs().max()) == 0 for r in healed["residuals"].values())
        assert not torch.equal(healed["globals"][0]["0.weight"], before["globals"][0]["0.weight"])
        common = lambda: sorted(set(replicas.steps("r0")) & set(replicas.steps("r1")))  # noqa: E731
        replicas.wait("two more syncs of both", lambda: len(common()) >= 3)
        for step in common():
            snaps = {n: replicas.load(n, step) for n in ("r0", "r1")}
            for key in ("applied", "globals", "outer", "step"):
                _equal(snaps["r1"][key], snaps["r0"][key], f"r1 vs r0 at sync {step}: {key}")
            assert snaps["r0"]["contributors"] == (1 if step == first else 2), (step, snaps)
        r0 = [replicas.load("r0", k) for k in replicas.steps("r0")]
        assert r0[0]["adam"] == 4 and r0[-1]["metrics"]["diloco/syncs_discarded"] == 1
        assert r0[-1]["loss"] < 0.25 * r0[0]["loss"], [s["loss"] for s in r0]  # 0.34 to 0.02
        replicas.stop_at(max(max(replicas.steps(n)) for n in ("r0", "r1")) + 1, ["r0", "r1"])
    finally:
        replicas.kill_all()


@pytest.mark.timeout(240)
def test_trainer_with_a_manager_syncs_across_replicas(tmp_path, lighthouse):
    ctx = mp.get_context(context_start_method())
    names = ("t0", "t1")
    procs = [ctx.Process(target=worker.trainer, args=(str(tmp_path), lighthouse, n), daemon=True)
             for n in names]  # fmt: skip
    try:
        for p in procs:
            p.start()
        for p in procs:
            p.join(LIMIT)
            assert p.exitcode == 0, p.exitcode
    finally:
        for p in procs:
            if p.is_alive():
                p.kill()
    runs = {n: torch.load(tmp_path / f"{n}.pt") for n in names}
    t0, t1 = runs["t0"], runs["t1"]
    equal = [torch.equal(a, b) for a, b in zip(t0["seen"], t1["seen"])]
    assert equal == [False, True, False, True], equal  # own data; a sync every 2 steps
    _equal(t0["globals"], t1["globals"], "global copies")
    for n, run in runs.items():
        assert run["metrics"]["diloco/step"] == 4 and run["metrics"]["diloco/syncs"] == 2
        assert f"diloco-{n}-rank0.pt" in run["files"], run["files"]
        assert run["wrapped"] != "DistributedDataParallel"  # a world of one: nothing to wrap


class FakeManager:
    """What Options and DiLoCo's constructor look at (torchft's Manager has these)."""

    _use_async_quorum = False

    def __init__(self, replica_id="replica:0"):
        self._replica_id = replica_id
        self._pg = types.SimpleNamespace(allgather=print, allreduce=print)  # never called

    start_quorum = should_commit = register_state_dict_fn = report_error = lambda *a: None


def test_what_a_manager_refuses_and_how_files_are_named():
    from torch_cgx.integrations.diloco import Options, file_tag, state_file

    with pytest.raises(ValueError, match="ranks_per_node=2 with a manager"):
        Options(4, ranks_per_node=2, manager=FakeManager())
    with pytest.raises(ValueError, match="give it a replica_id"):
        Options(4, manager=FakeManager(None))
    with pytest.raises(ValueError, match="manager must be a torchft Manager"):
        Options(4, manager=object())
    options = Options(4, manager=FakeManager("job/7:ü"))
    assert options.diloco_kwargs["manager"] is not None and options.replica == "job/7:ü"
    assert file_tag(3, options.replica) == "job%2F7%3A%C3%BC-rank3"
    assert state_file("d", 0) == os.path.join("d", "diloco-rank0.pt")
    assert "manager" not in Options(4).diloco_kwargs
    # a replica's file records the replica: another replica's is refused
    from torch_cgx.integrations.diloco import Session

    model = torch.nn.Linear(4, 2)
    saved = Session(model, Options(4, manager=FakeManager("a"))).state_dict()
    assert saved["replica"] == "a" and saved["loop_step"] == 0
    with pytest.raises(ValueError, match="replica 'a'.s, this is replica 'b'"):
        Session(model, Options(4, manager=FakeManager("b"))).load_state_dict(saved)
    Session(model, Options(4, manager=FakeManager("a"))).load_state_dict(saved, step=0)
