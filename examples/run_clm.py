"""Causal language modelling with transformers' Trainer on torch_cgx, run_clm-style.

A GPT-2 built from a config (no download) trains on a learnable synthetic corpus (tokens from a
fixed random bigram table, four successors per token: the loss can fall from ln(vocab) towards
ln 4) or on a text file (bytes as tokens). Flags choose what carries the gradients:

    torchrun --nproc-per-node 2 examples/run_clm.py                     # Trainer's own group
    torchrun --nproc-per-node 2 examples/run_clm.py --cgx-backend --bits 4
    torchrun --nproc-per-node 2 examples/run_clm.py --hook cgx --bits 4  # or compression,
                                                                         # powersgd, topk, ...
    python examples/run_clm.py --hosts 2 --link 1gbit --cgx-backend --bits 4
    python examples/run_clm.py --hosts 4 --link 100mbit --diloco --sync-every 20 --bits 4

``--hosts W --link RATE`` runs the ranks on W emulated hosts (network namespaces behind
rate-limited links: benchmarks/hosts.py, docs/hosts.md; root, in a checkout). On GPUs the same
command runs unchanged (Trainer puts the model on the rank's GPU; the cgx group serves CUDA
tensors). ``--diloco`` trains with DiLoCo across the ranks instead (attach_diloco: no gradient
allreduce between syncs; max-min ``--bits`` pseudo-gradients every ``--sync-every`` steps). Rank 0
ends with the stats line and a JSON summary (step time, bytes per step, the logged losses with
their wall time, the final model's held-out loss); ``--json FILE`` writes it to FILE too.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from typing import List, Optional

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_args(argv: Optional[List[str]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="run_clm.py", description=__doc__.splitlines()[0])
    how = p.add_mutually_exclusive_group()
    how.add_argument(
        "--cgx-backend",
        action="store_true",
        help="the cgx group compresses DDP's allreduce (--bits, CGX_* variables)",
    )
    how.add_argument("--hook", help="cgx, compression, powersgd or a compressor name (topk, ...)")
    how.add_argument(
        "--diloco", action="store_true", help="DiLoCo across the ranks (attach_diloco)"
    )
    p.add_argument("--sync-every", type=int, default=20, help="--diloco: H, steps between syncs")
    p.add_argument("--ranks-per-node", type=int, default=1, help="--diloco: DDP inside nodes")
    p.add_argument("--bits", type=int, default=None, help="max-min bits (1..8)")
    p.add_argument(
        "--hook-params",
        type=json.loads,
        default=None,
        help="the hook state's keywords as JSON, e.g. '{\"ratio\": 0.01}'",
    )
    p.add_argument("--train-file", help="a text file (bytes are tokens); default: synthetic")
    p.add_argument("--max-steps", type=int, default=60)
    p.add_argument("--batch-size", type=int, default=8, help="per device")
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--n-layer", type=int, default=4)
    p.add_argument("--n-embd", type=int, default=256)
    p.add_argument("--n-head", type=int, default=4)
    p.add_argument("--vocab-size", type=int, default=8192)
    p.add_argument("--learning-rate", type=float, default=3e-3)
    p.add_argument("--logging-steps", type=int, default=10)
    p.add_argument("--save-steps", type=int, default=0, help="checkpoint every N steps (0: no)")
    p.add_argument("--resume", action="store_true", help="resume from the last checkpoint")
    p.add_argument("--output-dir", default=os.path.join("/tmp", f"run_clm-{os.getuid()}"))
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", help="also write the summary to this file")
    args = p.parse_args(argv)
    if args.bits is not None and not (1 <= args.bits <= 8):
        p.error(f"--bits must be in 1..8, got {args.bits}")
    if args.bits is not None and not (args.cgx_backend or args.hook or args.diloco):
        p.error("--bits goes with --cgx-backend, --hook or --diloco")
    return args


def synthetic(n: int, seq: int, vocab: int, seed: int, held_out: bool = False) -> torch.Tensor:
    """``n`` sequences from a fixed random bigram table (4 successors per token); ``held_out``:
    other sequences from the same table."""
    g = torch.Generator().manual_seed(seed)
    table = torch.randint(0, vocab, (vocab, 4), generator=g)
    if held_out:
        g.manual_seed(seed + 7919)
    ids = torch.empty(n, seq, dtype=torch.long)
    ids[:, 0] = torch.randint(0, vocab, (n,), generator=g)
    for t in range(1, seq):
        ids[:, t] = table[ids[:, t - 1], torch.randint(0, 4, (n,), generator=g)]
    return ids


def from_file(path: str, seq: int) -> torch.Tensor:
    with open(path, "rb") as f:
        data = torch.frombuffer(bytearray(f.read()), dtype=torch.uint8).long()
    n = data.numel() // seq
    if n == 0:
        raise SystemExit(f"{path} holds fewer than --seq-len {seq} bytes")
    return data[: n * seq].view(n, seq)


class Timer:
    """Wall time of each optimizer step (callback events), the first 5 left out as warm-up, and
    each logged loss with the seconds since training began (the loss curve against wall time)."""

    def __init__(self):
        from transformers import TrainerCallback

        timer = self
        self.times: List[float] = []
        self.curve: List[list] = []  # [step, seconds, loss]

        class _T(TrainerCallback):
            def on_train_begin(self, args, state, control, **kw):
                timer.start = time.perf_counter()

            def on_step_begin(self, args, state, control, **kw):
                timer.t0 = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                timer.times.append(time.perf_counter() - timer.t0)

            def on_train_end(self, args, state, control, **kw):
                timer.end = time.perf_counter()

            def on_log(self, args, state, control, logs=None, **kw):
                if logs and "loss" in logs:
                    seconds = round(time.perf_counter() - timer.start, 3)
                    timer.curve.append([state.global_step, seconds, round(float(logs["loss"]), 5)])

        self.callback = _T()

    def mean_ms(self) -> float:
        rest = self.times[5:] or self.times
        return 1e3 * sum(rest) / max(len(rest), 1)


def train(args: argparse.Namespace) -> dict:
    import torch.distributed as dist
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

    import torch_cgx
    from torch_cgx.integrations import attach, init_cgx

    if args.cgx_backend:
        init_cgx(**({"bits": args.bits} if args.bits else {}))
    elif args.hook:
        init_cgx(bits=32)  # exact: only the hook compresses
    vocab = 256 if args.train_file else args.vocab_size
    torch.manual_seed(args.seed)
    config = GPT2Config(n_layer=args.n_layer, n_embd=args.n_embd, n_head=args.n_head,
                        vocab_size=vocab, n_positions=args.seq_len, bos_token_id=0,
                        eos_token_id=0)  # fmt: skip
    model = GPT2LMHeadModel(config)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    n = args.max_steps * args.batch_size * world
    ids = (from_file(args.train_file, args.seq_len) if args.train_file
           else synthetic(n, args.seq_len, vocab, args.seed + 1))  # fmt: skip
    data = [{"input_ids": r, "labels": r} for r in ids]
    targs = TrainingArguments(
        output_dir=args.output_dir, per_device_train_batch_size=args.batch_size,
        max_steps=args.max_steps, learning_rate=args.learning_rate, seed=args.seed,
        logging_steps=args.logging_steps, report_to=[], disable_tqdm=True,
        save_strategy="steps" if args.save_steps else "no", save_steps=args.save_steps or 500,
        use_cpu=not torch.cuda.is_available(), ddp_find_unused_parameters=False,
    )  # fmt: skip
    trainer = Trainer(model=model, args=targs, train_dataset=data)
    if args.diloco:
        from torch_cgx.integrations import attach_diloco

        cb = attach_diloco(trainer, sync_every=args.sync_every, ranks_per_node=args.ranks_per_node,
                           compressor_params={"bits": args.bits or 4})  # fmt: skip
    else:
        bits = args.bits if args.hook else None  # the backend's went to init_cgx
        cb = attach(trainer, args.hook, bits=bits, params=args.hook_params)
    timer = Timer()
    trainer.add_callback(timer.callback)
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    held = (
        ids if args.train_file else synthetic(8 * world, args.seq_len, vocab, args.seed + 1, True)
    )
    held_out = [{"input_ids": r, "labels": r} for r in held[: 8 * world]]  # a file: its start
    eval_loss = trainer.evaluate(eval_dataset=held_out)["eval_loss"]  # DiLoCo: after final_sync
    return summary(args, trainer, cb, timer, dist, torch_cgx) | {"eval_loss": round(eval_loss, 5)}


def summary(args, trainer, cb, timer, dist, torch_cgx) -> dict:
    """Step time, bytes per step (this rank's, on the wire), losses at the logged steps."""
    steps = len(timer.times)
    if args.diloco:  # the pseudo-gradients' payloads, nothing between syncs; Trainer's own
        # group (Gloo) all-gathers them in a ring: each rank passes on W - 1 payloads
        world = dist.get_world_size() if dist.is_initialized() else 1
        sent = cb.session.bytes_sent * (world - 1)
    elif cb.state is not None:
        sent = torch_cgx.stats(cb.state).bytes_sent
    elif torch_cgx.is_cgx_group():
        sent = torch_cgx.stats().bytes_sent
    else:  # Gloo / NCCL ring allreduce of every gradient: 2 (W - 1) / W of their bytes
        world = dist.get_world_size() if dist.is_initialized() else 1
        grads = sum(p.numel() * p.element_size() for p in trainer.model.parameters())
        sent = 2 * (world - 1) / world * grads * steps
    losses = {h["step"]: h["loss"] for h in trainer.state.log_history if "loss" in h}
    how = "cgx backend" if args.cgx_backend else (f"hook {args.hook}" if args.hook else "")
    how = f"diloco H={args.sync_every}" if args.diloco else how
    how = how or (dist.get_backend() if dist.is_initialized() else "one process")
    params = sum(p.numel() for p in trainer.model.parameters())
    bits = args.bits or (4 if args.diloco else None)
    world = dist.get_world_size() if dist.is_initialized() else 1
    return {"method": how + (f" {bits} bits" if bits else ""), "steps": steps, "world": world,
            "step_ms": round(timer.mean_ms(), 1), "bytes_per_step": round(sent / max(steps, 1)),
            "losses": losses, "params_m": round(params / 1e6, 2),
            "wall_s": round(timer.end - timer.start, 2), "curve": timer.curve}  # fmt: skip


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if "--hosts" in " ".join(argv):
        sys.path.insert(0, ROOT)  # benchmarks/ lives in the checkout
        from benchmarks.hosts import maybe_run_on_hosts

        env_code = maybe_run_on_hosts(argv, "examples.run_clm")
        if env_code is not None:
            return env_code
    args = parse_args(argv)
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    result = train(args)
    if int(os.environ.get("RANK", "0")) == 0:
        print("run_clm: " + json.dumps(result), flush=True)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(result, f)
    return 0


if __name__ == "__main__":
    sys.exit(main())
