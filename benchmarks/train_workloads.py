"""Workloads of the training benchmark (benchmarks/train.py): models, data, losses.

  gpt2    a GPT-2 (transformers' GPT2LMHeadModel), byte-level (256 bytes + a file separator),
          trained on the Python standard library's own .py files
  digits  a small CNN on scikit-learn's bundled 8x8 digits, fixed train/test split, per-rank
          shards of the training set
  lstm    a byte-level LSTM language model (embedding, stacked LSTM, linear head) on the gpt2
          workload's corpus, batches and held-out windows (--seq-len, --corpus-mb)

Every batch is a pure function of (seed, step, rank), so every method sees the same data.
"""

from __future__ import annotations

import argparse
import os
import sysconfig
import zlib
from typing import Dict, List

import numpy as np
import torch
import torch.nn.functional as F

WORKLOADS = ("gpt2", "digits", "lstm")

# Per-workload defaults: one method's run of gpt2 at W = 2 takes about half a minute on a
# 2-core CPU; digits steps take milliseconds.
DEFAULTS = {
    "gpt2": {"steps": 12, "batch": 4, "lr": 1e-3, "lr_warmup": 4, "log_every": 3},
    "digits": {"steps": 120, "batch": 32, "lr": 0.05, "lr_warmup": 0, "log_every": 40},
    "lstm": {"steps": 12, "batch": 4, "lr": 3e-3, "lr_warmup": 4, "log_every": 3},
}


def _seed(*parts: int) -> int:
    """A 32-bit seed mixed from integers, the same on every machine and Python version."""
    return int(np.random.SeedSequence([int(p) for p in parts]).generate_state(1)[0])


class Workload:
    """A model factory, a deterministic batch per (step, rank), a loss and a final evaluation."""

    name = ""
    batch = 1  # samples per rank per step
    steps = 2
    lr_warmup = 0  # steps of linear learning-rate ramp
    log_every = 1

    def model(self) -> torch.nn.Module:
        raise NotImplementedError

    def optimizer(self, params, momentum: bool = True) -> torch.optim.Optimizer:
        """``momentum=False``: the gradients already carry momentum (a hook's, e.g. DGC's or
        Signum's), so an SGD optimizer drops its own; adaptive optimizers keep theirs."""
        raise NotImplementedError

    def get_batch(self, step: int, rank: int):
        raise NotImplementedError

    def loss(self, model: torch.nn.Module, batch) -> torch.Tensor:
        raise NotImplementedError

    def evaluate(self, model: torch.nn.Module, rank: int) -> Dict[str, float]:
        return {}

    def info(self) -> dict:
        return {}


def stdlib_corpus(max_bytes: int) -> tuple:
    """The standard library's .py files (site-packages excluded), in sorted path order, joined
    with the separator token 256 and cut at ``max_bytes`` tokens. Returns (int16 tensor, files)."""
    root = sysconfig.get_paths()["stdlib"]
    chunks, total, files = [], 0, 0
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(
            d for d in dirnames if d not in ("site-packages", "dist-packages", "__pycache__")
        )
        for name in sorted(filenames):
            if not name.endswith(".py") or total >= max_bytes:
                continue
            try:
                with open(os.path.join(dirpath, name), "rb") as f:
                    data = f.read()
            except OSError:
                continue
            chunks.append(np.frombuffer(data, dtype=np.uint8).astype(np.int16))
            chunks.append(np.array([256], dtype=np.int16))
            total += len(data) + 1
            files += 1
        if total >= max_bytes:
            break
    if not chunks:
        raise RuntimeError(f"no .py files under {root}")
    tokens = np.concatenate(chunks)[:max_bytes]
    return torch.from_numpy(tokens), files


class ByteCorpusWorkload(Workload):
    """Next-byte prediction on the standard library's source (stdlib_corpus): 95 % to train,
    the rest held out; subclasses give the model and ``logits(model, tokens)``."""

    def __init__(self, args: argparse.Namespace, seed: int, batch: int) -> None:
        self.args, self.seed, self.batch = args, seed, batch
        self.seq_len = args.seq_len
        tokens, self.files = stdlib_corpus(int(args.corpus_mb * 2**20))
        split = int(len(tokens) * 0.95)
        self.train, self.val = tokens[:split], tokens[split:]
        if len(self.val) <= self.seq_len + 1:
            raise ValueError("corpus too small for --seq-len")
        self.crc = zlib.crc32(tokens.numpy().tobytes())

    def logits(self, model, tokens: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _windows(self, tokens: torch.Tensor, n: int, gen: torch.Generator) -> torch.Tensor:
        starts = torch.randint(0, len(tokens) - self.seq_len - 1, (n,), generator=gen)
        return torch.stack([tokens[s : s + self.seq_len + 1] for s in starts.tolist()]).long()

    def get_batch(self, step: int, rank: int):
        gen = torch.Generator().manual_seed(_seed(self.seed, step, rank, 1))
        return self._windows(self.train, self.batch, gen)

    def loss(self, model, batch) -> torch.Tensor:
        logits = self.logits(model, batch[:, :-1])
        return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))

    @torch.no_grad()
    def evaluate(self, model, rank: int) -> Dict[str, float]:
        model.eval()
        losses = []
        for i in range(self.args.eval_batches):
            gen = torch.Generator().manual_seed(_seed(self.seed, i, rank, 2))
            losses.append(float(self.loss(model, self._windows(self.val, self.batch, gen))))
        model.train()
        return {"val_loss": sum(losses) / max(1, len(losses))} if losses else {}

    def corpus_info(self) -> dict:
        return {
            "seq_len": self.seq_len,
            "corpus_tokens": len(self.train) + len(self.val),
            "corpus_files": self.files,
            "corpus_crc32": self.crc,
        }


class GPT2Workload(ByteCorpusWorkload):
    name = "gpt2"

    def __init__(self, args: argparse.Namespace, seed: int) -> None:
        if args.seq_len > args.n_positions:
            raise ValueError(f"--seq-len {args.seq_len} > --n-positions {args.n_positions}")
        super().__init__(args, seed, args.gpt2_batch)
        os.environ["HF_HUB_OFFLINE"] = "1"
        os.environ["TRANSFORMERS_OFFLINE"] = "1"
        os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
        from transformers import GPT2Config, GPT2LMHeadModel

        self._model_cls = GPT2LMHeadModel
        self.config = GPT2Config(
            vocab_size=257,  # bytes + the file separator
            n_positions=args.n_positions,
            n_embd=args.n_embd,
            n_layer=args.n_layer,
            n_head=args.n_head,
            resid_pdrop=0.0,  # no dropout: the only randomness is the batch sampling
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            bos_token_id=256,
            eos_token_id=256,
        )

    def model(self) -> torch.nn.Module:
        return self._model_cls(self.config)

    def logits(self, model, tokens: torch.Tensor) -> torch.Tensor:
        return model(tokens).logits

    def optimizer(self, params, momentum: bool = True) -> torch.optim.Optimizer:
        if getattr(self.args, "gpt2_optimizer", "adamw") == "sgd":  # where error feedback's
            # theory holds (it does not for Adam's second moment)
            return torch.optim.SGD(params, lr=self.args.gpt2_lr, momentum=0.9 if momentum else 0.0)
        return torch.optim.AdamW(params, lr=self.args.gpt2_lr, betas=(0.9, 0.95), weight_decay=0.0)

    def info(self) -> dict:
        return {
            "config": {
                k: getattr(self.config, k)
                for k in ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head")
            },
            **self.corpus_info(),
            "lr": self.args.gpt2_lr,
            "optimizer": "SGD(momentum=0.9)"
            if getattr(self.args, "gpt2_optimizer", "adamw") == "sgd"
            else "AdamW(betas=(0.9, 0.95))",
        }


class ByteLSTM(torch.nn.Module):
    def __init__(self, embed: int, hidden: int, layers: int) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(257, embed)
        self.lstm = torch.nn.LSTM(embed, hidden, num_layers=layers, batch_first=True)
        self.head = torch.nn.Linear(hidden, 257)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.lstm(self.embed(tokens))[0])


class LSTMWorkload(ByteCorpusWorkload):
    name = "lstm"

    def __init__(self, args: argparse.Namespace, seed: int) -> None:
        super().__init__(args, seed, args.lstm_batch)

    def model(self) -> torch.nn.Module:
        return ByteLSTM(self.args.lstm_embed, self.args.lstm_hidden, self.args.lstm_layers)

    def logits(self, model, tokens: torch.Tensor) -> torch.Tensor:
        return model(tokens)

    def optimizer(self, params, momentum: bool = True) -> torch.optim.Optimizer:
        return torch.optim.AdamW(params, lr=self.args.lstm_lr, betas=(0.9, 0.95), weight_decay=0.0)

    def info(self) -> dict:
        a = self.args
        return {
            "config": {"embed": a.lstm_embed, "hidden": a.lstm_hidden, "layers": a.lstm_layers},
            **self.corpus_info(),
            "lr": a.lstm_lr,
            "optimizer": "AdamW(betas=(0.9, 0.95))",
        }


class DigitsCNN(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 32, 3, padding=1)  # 288 weights: exact in cgx
        self.conv2 = torch.nn.Conv2d(32, 64, 3, padding=1)
        self.fc1 = torch.nn.Linear(64 * 4 * 4, 128)
        self.fc2 = torch.nn.Linear(128, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        return self.fc2(F.relu(self.fc1(x.flatten(1))))


class DigitsWorkload(Workload):
    name = "digits"

    def __init__(self, args: argparse.Namespace, seed: int, rank: int, world: int) -> None:
        from sklearn.datasets import load_digits

        self.args, self.seed, self.batch = args, seed, args.digits_batch
        data = load_digits()
        x = torch.tensor(data.images, dtype=torch.float32).unsqueeze(1) / 16.0
        y = torch.tensor(data.target, dtype=torch.int64)
        perm = torch.randperm(len(y), generator=torch.Generator().manual_seed(0))  # fixed split
        n_test = len(y) // 5
        test, train = perm[:n_test], perm[n_test:]
        self.x_test, self.y_test = x[test], y[test]
        shard = train[rank::world]  # this rank's shard of the training set
        self.x, self.y = x[shard], y[shard]
        self.n_train, self.n_test = len(train), n_test

    def model(self) -> torch.nn.Module:
        return DigitsCNN()

    def optimizer(self, params, momentum: bool = True) -> torch.optim.Optimizer:
        return torch.optim.SGD(params, lr=self.args.digits_lr, momentum=0.9 if momentum else 0.0)

    def get_batch(self, step: int, rank: int):
        gen = torch.Generator().manual_seed(_seed(self.seed, step, rank, 3))
        idx = torch.randperm(len(self.y), generator=gen)[: self.batch]
        return self.x[idx], self.y[idx]

    def loss(self, model, batch) -> torch.Tensor:
        x, y = batch
        return F.cross_entropy(model(x), y)

    @torch.no_grad()
    def evaluate(self, model, rank: int) -> Dict[str, float]:
        model.eval()
        logits = model(self.x_test)
        model.train()
        return {
            "test_loss": float(F.cross_entropy(logits, self.y_test)),
            "test_acc": float((logits.argmax(1) == self.y_test).float().mean()),
        }

    def info(self) -> dict:
        return {
            "train_samples": self.n_train,
            "test_samples": self.n_test,
            "lr": self.args.digits_lr,
            "optimizer": "SGD(momentum=0.9)",
        }


def parse_workloads(text: str) -> List[str]:
    names = [w.strip() for w in text.split(",") if w.strip()]
    bad = [w for w in names if w not in WORKLOADS]
    if bad or not names or len(set(names)) != len(names):
        raise argparse.ArgumentTypeError(f"workloads: distinct names of {WORKLOADS}, got {text!r}")
    return names


def make_workload(name: str, args, rank: int, world: int) -> Workload:
    if name == "gpt2":
        w = GPT2Workload(args, args.seed)
    elif name == "lstm":
        w = LSTMWorkload(args, args.seed)
    else:
        w = DigitsWorkload(args, args.seed, rank, world)
    w.steps = getattr(args, f"{name}_steps")
    w.lr_warmup = getattr(args, f"{name}_lr_warmup")
    w.log_every = args.log_every or DEFAULTS[name]["log_every"]
    return w
