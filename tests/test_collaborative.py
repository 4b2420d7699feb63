"""torch_cgx.collaborative in one process: the plan of an epoch, addresses, bad arguments, and
one peer alone on a Lighthouse of its own (the round's wire: test_collaborative_wire.py)."""

from __future__ import annotations

import time

import pytest
import torch

pytest.importorskip("torchft")

from torch_cgx.collaborative import Optimizer, plan, rendezvous  # noqa: E402

# --- the plan ---------------------------------------------------------------------------------


def test_plan_gives_a_slow_peer_its_share_and_reaches_the_target():
    counts = plan([3.0, 3.0, 1.0], [32, 32, 32], 256)
    assert sum(counts) * 32 >= 256
    assert counts == [4, 4, 1]  # every batch ends by 4 fast units: the slow peer's 1 of 3
    # nobody ends later than the last: the slow peer's one batch (3 units) fits in 4
    ends = [c * 32 / r for c, r in zip(counts, [3.0, 3.0, 1.0])]
    assert max(ends) == pytest.approx(4 * 32 / 3.0)


def test_plan_unknown_rates_are_the_mean_and_everyone_does_a_batch():
    assert plan([None, None], [8, 8], 64) == [4, 4]
    assert plan([10.0, None], [8, 8], 64) == [4, 4]
    assert plan([1000.0, 1.0], [8, 8], 8) == [1, 1]  # at least one batch each
    with pytest.raises(ValueError, match="one rate and one batch size per peer"):
        plan([1.0], [8, 8], 64)


# --- rendezvous ---------------------------------------------------------------------------------


def test_addresses():
    assert rendezvous.parse_address("10.0.0.2:29510") == ("10.0.0.2", 29510)
    assert rendezvous.parse_address("http://h:1") == ("h", 1)
    assert rendezvous.parse_address("/ip4/10.1.2.3/tcp/31337/p2p/QmXyz") == ("10.1.2.3", 31337)
    for bad in ("nohost", "h:0", "h:99999", ":5"):
        with pytest.raises(ValueError, match="is not an address"):
            rendezvous.parse_address(bad)
    assert rendezvous.local_host(None, None, ["/ip4/10.9.8.7/tcp/0"]) == "10.9.8.7"


def test_initial_peers_from_the_environment(monkeypatch):
    monkeypatch.delenv("INITIAL_PEERS", raising=False)
    monkeypatch.setenv("PL_INITIAL_PEERS", "10.0.0.5:1234,10.0.0.6:1")
    assert rendezvous.join_address(None) == ("10.0.0.5", 1234)
    monkeypatch.setenv("INITIAL_PEERS", "10.0.0.7:99")
    assert rendezvous.join_address(None) == ("10.0.0.7", 99)
    assert rendezvous.join_address(["h:5"]) == ("h", 5)


# --- bad arguments ----------------------------------------------------------------------------


def _model():
    torch.manual_seed(0)
    return torch.nn.Linear(4, 2)


@pytest.mark.parametrize(
    "kwargs, error, match",
    [
        ({"dht": object()}, ValueError, "initial_peers='host:port'"),
        ({"client_mode": True}, ValueError, "no client mode"),
        ({"auxiliary": True}, ValueError, "auxiliary"),
        ({"extra_tensors": [torch.zeros(1)]}, ValueError, "extra tensors"),
        ({"no_such_option": 1}, TypeError, "no_such_option"),
        ({"target_batch_size": 0}, ValueError, "target_batch_size must be in"),
        ({"averaging_timeout": 0}, ValueError, "averaging_timeout"),
        ({"optimizer": 3}, ValueError, "optimizer must be"),
        ({"params": None}, ValueError, "needs params="),
        ({"initial_peers": "nohost"}, ValueError, "is not an address"),
        ({"use_local_updates": True, "grad_averager_factory": lambda p: None}, ValueError,
         "does not go with use_local_updates"),
        ({"grad_compression": "fp16"}, ValueError, "compression must be"),
        ({"performance_ema_alpha": 2}, ValueError, "performance_ema_alpha"),
        ({"use_local_updates": True, "delay_grad_averaging": True}, ValueError,
         "leave the delay flags out"),
        ({"delay_optimizer_step": True, "grad_averager_factory": lambda p: None}, ValueError,
         "do not go with grad_averager_factory"),
        ({"wait_for_round": True}, ValueError, "pass delay_grad_averaging=True"),
    ],
)  # fmt: skip
def test_bad_arguments_name_the_problem(kwargs, error, match):
    model = _model()
    args = dict(run_id="r", target_batch_size=8, optimizer=torch.optim.SGD,
                params=list(model.parameters()))  # fmt: skip
    args.update(kwargs)
    with pytest.raises(error, match=match):
        Optimizer(**args)


def test_params_with_an_optimizer_instance_is_refused():
    model = _model()
    with pytest.raises(ValueError, match="pass params only with an optimizer class"):
        Optimizer(run_id="r", target_batch_size=8, params=model.parameters(),
                  optimizer=torch.optim.SGD(model.parameters(), lr=0.1))  # fmt: skip


def test_hivemind_strategy_refuses_what_the_module_gives():
    pytest.importorskip("lightning")
    from torch_cgx.lightning import hivemind_strategy_class

    cls = hivemind_strategy_class("lightning")
    with pytest.raises(ValueError, match="comes from the LightningModule"):
        cls(target_batch_size=8, optimizer=torch.optim.SGD)
    with pytest.raises(ValueError, match="initial_peers='host:port'"):
        cls(target_batch_size=8, dht=object())


# --- one peer alone ---------------------------------------------------------------------------


def test_a_lone_peer_steps_every_target_batch(capsys):
    model = _model()
    opt = Optimizer(run_id="alone", target_batch_size=32, batch_size_per_step=8, host="127.0.0.1",
                    optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1), params=model.parameters(),
                    scheduler=lambda o: torch.optim.lr_scheduler.StepLR(o, 1, gamma=0.5),
                    averaging_timeout=5.0, matchmaking_time=1.0)  # fmt: skip
    try:
        assert opt.lighthouse is not None and opt.address in capsys.readouterr().out
        # lateness counts from the last round's end: a left-out peer's request opens a round
        assert opt.lighthouse.join_timeout == pytest.approx(1.0 + 5.0)
        x, y = torch.randn(8, 4, generator=torch.Generator().manual_seed(1)), torch.zeros(8, 2)
        before = model.weight.detach().clone()
        grads = []
        for i in range(4):
            torch.nn.functional.mse_loss(model(x * (i + 1)), y).backward()
            grads.append(model.weight.grad.clone())
            opt.step()
            opt.zero_grad()
            assert opt.local_epoch == (1 if i == 3 else 0)
        assert opt.local_epoch == 1 and opt.last_round["samples"] == 32
        # one SGD step with the mean of the four batches' gradients (equal batch sizes)
        mean = sum(g * 8 for g in grads) / 32
        assert torch.allclose(model.weight.detach(), before - 0.1 * mean, atol=1e-6)
        assert opt.optimizer.param_groups[0]["lr"] == pytest.approx(0.05)  # the scheduler
        state = opt.state_dict()
        assert state["local_epoch"] == 1
        with pytest.raises(ValueError, match="not a collaborative Optimizer state"):
            opt.load_state_dict({"optimizer": {}})
        with pytest.raises(ValueError, match="batch_size"):
            opt.step(batch_size=0)
    finally:
        opt.shutdown()


def test_a_lone_peer_with_delay_steps_with_the_epochs_it_took():
    """delay_grad_averaging: rounds run in the background while step() goes on; each epoch
    holds the contiguous samples taken at its round's start (at least the target), and the
    parameters are the SGD steps with their means, applied one epoch late."""
    model = _model()
    opt = Optimizer(run_id="alone-bg", target_batch_size=32, batch_size_per_step=8,
                    host="127.0.0.1", optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                    params=model.parameters(), averaging_timeout=5.0, matchmaking_time=1.0,
                    delay_grad_averaging=True)  # fmt: skip
    try:
        before = model.weight.detach().clone()
        grads, epochs, x = [], [], torch.randn(8, 4, generator=torch.Generator().manual_seed(2))
        deadline = time.monotonic() + 30
        while opt.local_epoch < 3 and time.monotonic() < deadline:
            torch.nn.functional.mse_loss(
                model(x * (len(grads) % 5 + 1)), torch.zeros(8, 2)
            ).backward()
            grads.append(model.weight.grad.clone())
            epoch = opt.local_epoch
            opt.step()
            opt.zero_grad()
            if opt.local_epoch != epoch:
                epochs.append(opt.last_round["samples"])
            time.sleep(0.005)
        assert opt.local_epoch == 3 and len(epochs) == 3, (opt.local_epoch, epochs)
        assert all(n >= 32 and n % 8 == 0 for n in epochs), epochs
        # the steps taken during a round are the next epoch's, none lost: contiguous chunks
        assert sum(epochs) <= 8 * len(grads)
        expected, start = before.clone(), 0
        for n in epochs:
            chunk = grads[start : start + n // 8]
            expected -= 0.1 * (sum(g * 8 for g in chunk) / n)
            start += n // 8
        assert torch.allclose(model.weight.detach(), expected, atol=1e-6)
    finally:
        opt.shutdown()


@pytest.mark.parametrize("wait", [False, True])
def test_a_delayed_peer_computes_on_during_a_slow_round_unless_it_waits(wait):
    """A round slower than the compute: without wait_for_round every sample computed meanwhile
    goes into the next epoch (many times the target); with it the peer waits in step() and
    each epoch is the planned batch (the target, here 4 batches of 8)."""
    model = _model()
    opt = Optimizer(run_id=f"slow-round-{wait}", target_batch_size=32, batch_size_per_step=8,
                    host="127.0.0.1", optimizer=lambda ps: torch.optim.SGD(ps, lr=0.1),
                    params=model.parameters(), averaging_timeout=5.0, matchmaking_time=1.0,
                    delay_grad_averaging=True, wait_for_round=wait)  # fmt: skip
    run = opt._run
    opt._run = lambda job: (time.sleep(0.3), run(job))[1]  # a slow link
    try:
        epochs, steps, x = [], 0, torch.randn(8, 4, generator=torch.Generator().manual_seed(2))
        deadline = time.monotonic() + 30
        while opt.local_epoch < 4 and time.monotonic() < deadline:
            torch.nn.functional.mse_loss(model(x), torch.zeros(8, 2)).backward()
            epoch = opt.local_epoch
            opt.step()
            opt.zero_grad()
            steps += 1
            if opt.local_epoch != epoch:
                epochs.append(opt.last_round["samples"])
            time.sleep(0.01)
        assert opt.local_epoch == 4, epochs
        if wait:  # 0.3 s rounds of 4 batches: most of the time waiting
            assert epochs[1:] == [32] * 3 and steps < 5 * 4 + 8, (epochs, steps)
            # the waits are not compute: the rate is that of the ~10 ms batches (~700/s), not
            # 32 samples a round (~100/s), or the plan would give this peer too small a share
            assert opt._rate.value > 200, opt._rate.value
        else:  # a round is >= 0.3 s of ~10 ms batches: ~30 batches an epoch, none lost
            assert all(n >= 8 * 8 for n in epochs[1:]), epochs
            assert sum(epochs) <= 8 * steps
    finally:
        opt.shutdown()


def test_the_standalone_lighthouse_command():
    import signal
    import subprocess
    import sys

    proc = subprocess.Popen([sys.executable, "-m", "torch_cgx.collaborative", "--port", "0",
                             "--host", "127.0.0.1"], stdout=subprocess.PIPE, text=True)  # fmt: skip
    try:
        line = proc.stdout.readline()
        assert "lighthouse at 127.0.0.1:" in line, line
        host, port = rendezvous.parse_address(line.split("initial_peers=")[1].strip(" ')\n"))
        assert host == "127.0.0.1" and port > 0
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(30) == 0
    finally:
        proc.kill()


def test_hivemind_strategy_fits_alone_under_lightning(tmp_path):
    pl = pytest.importorskip("lightning.pytorch")
    from torch_cgx.lightning import hivemind_strategy_class

    epochs = []

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return torch.nn.functional.mse_loss(self.net(batch[0]), batch[1])

        def on_train_batch_end(self, outputs, batch, batch_idx):
            epochs.append(self.trainer.strategy.collaborative.local_epoch)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    x = torch.randn(64, 4, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :1]), batch_size=8)
    strategy = hivemind_strategy_class("lightning")(target_batch_size=16, host="127.0.0.1",
                                                     averaging_timeout=5.0)  # fmt: skip
    trainer = pl.Trainer(strategy=strategy, accelerator="cpu", devices=1, max_steps=8,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         default_root_dir=str(tmp_path))  # fmt: skip
    trainer.fit(Module(), data)
    assert epochs == [0, 1, 1, 2, 2, 3, 3, 4]  # a global step every 2 batches of 8 (the target 16)
    assert strategy.collaborative is None  # torn down
