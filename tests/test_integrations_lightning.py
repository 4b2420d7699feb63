"""torch_cgx.lightning.CGXStatsCallback: the cgx group's and the strategy hook's stats written to
Lightning's loggers, on 2 ranks started as torchrun would (Lightning launches nothing)."""

from __future__ import annotations

import importlib.util

import pytest
import torch
from dist_helpers import run_ranks

pytestmark = pytest.mark.skipif(importlib.util.find_spec("lightning") is None,
                                reason="lightning is not installed")  # fmt: skip
ELASTIC = {"TORCHELASTIC_RUN_ID": "cgx-test", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "0"}
STEPS = 8


def body(rank, world):
    import lightning.pytorch as L

    import torch_cgx
    from torch_cgx.lightning import CGXStatsCallback, CGXStrategy

    class Memory(L.loggers.logger.Logger):
        """A logger that keeps what it is given."""

        def __init__(self):
            super().__init__()
            self.rows = []

        name, version = "memory", 0
        log_hyperparams = staticmethod(lambda *a, **k: None)

        def log_metrics(self, metrics, step=None):
            self.rows.append((step, dict(metrics)))

    class Regression(L.LightningModule):
        def __init__(self):
            super().__init__()
            torch.manual_seed(0)
            self.net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(),
                                           torch.nn.Linear(64, 4))  # fmt: skip

        def training_step(self, batch, _):
            x, y = batch
            return torch.nn.functional.mse_loss(self.net(x), y)

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    g = torch.Generator().manual_seed(1)
    x = torch.randn(256, 32, generator=g)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(x, x[:, :4]), batch_size=16)
    memory = Memory()
    strategy = CGXStrategy("maxmin", {"bits": 4, "bucket_size": 128})
    trainer = L.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_steps=STEPS,
                        logger=memory, log_every_n_steps=2, callbacks=[CGXStatsCallback()],
                        enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False)  # fmt: skip
    trainer.fit(Regression(), data)
    h = torch_cgx.stats(strategy.hook_state)
    assert h.hook == "compression_hook" and h.steps == STEPS, h
    assert 0 < h.bytes_sent < h.bytes_exact / 2 and h.calls_compressed == STEPS, h
    if rank == 0:  # Lightning's loggers write on rank 0
        rows = [m for _, m in memory.rows if "cgx_hook/ratio" in m]
        assert len(rows) == STEPS // 2, memory.rows
        assert rows[-1]["cgx_hook/bytes_sent"] == h.bytes_sent and "cgx/bytes_sent" in rows[-1]
        assert rows[-1]["cgx_hook/bytes_per_step"] == pytest.approx(h.bytes_sent / STEPS, rel=0.2)
    with pytest.raises(ValueError, match="every_n_steps"):
        CGXStatsCallback(every_n_steps=0)


def test_stats_callback_logs_group_and_hook_stats():
    run_ranks(body, 2, env=ELASTIC, timeout=180)
