"""``torch_cgx.collaborative.Optimizer``: hivemind's Optimizer on torchft, every peer bitwise
equal after every epoch (docs/collaborative.md)."""

from __future__ import annotations

import logging
import time
from typing import Optional

import torch

from torch_cgx.collaborative import arguments, butterfly, progress, rendezvous, wire
from torch_cgx.collaborative.state import PeerState
from torch_cgx.compression import TensorRole

__all__ = ["Optimizer"]

KEY = "torch_cgx.collaborative"
_log = logging.getLogger("torch_cgx.collaborative")


class Optimizer:
    """Trains one model with peers that join, leave and run at different speeds.

    Args (hivemind's names):
        run_id: the collaboration's name (peers' ids start with it).
        target_batch_size: samples the peers process together per global step (an epoch).
        optimizer: a ``torch.optim.Optimizer``, or a class / factory called with ``params``.
        params: the parameters (with an optimizer class or factory).
        batch_size_per_step: samples of one ``step()`` (else ``step(batch_size=...)``).
        scheduler: an LR scheduler or a factory ``optimizer -> scheduler``, stepped per epoch.
        grad_compression: a ``torch_cgx.compression`` object (per-tensor policies included)
            for the gradients; None: exact fp32.
        state_averaging_compression: the same for the parameters averaged with
            ``use_local_updates=True``.
        initial_peers: the Lighthouse to join (``"host:port"``); None: ``INITIAL_PEERS`` /
            ``PL_INITIAL_PEERS``, else this peer hosts it (``self.address``, printed).
        matchmaking_time: how long a hosted Lighthouse waits for peers that are alive but
            late to a round before it starts the round without them (s).
        averaging_timeout: a round's collectives and state transfer (s): a peer that dies or
            stalls in a round is dropped within it.
        use_local_updates: step the optimizer on every ``step()`` and average the parameters
            every ``average_state_every`` epochs (hivemind's local-updates mode).
        grad_averager_factory: ``factory(params)`` -> an averager of ``p.grad`` such as
            ``partial(PowerSGDGradientAverager, averager_rank=32)``.
        reuse_grad_buffers: ``step()`` consumes and zeroes ``p.grad`` (do not call
            ``zero_grad``); False: call ``zero_grad()`` after ``step()`` as usual.
        verbose: print one line per epoch.
    torch_cgx's own: ``error_feedback`` (None: for biased compressors), ``host`` /
    ``host_maddrs`` (the address others reach this peer at), ``heartbeat_timeout`` (a hosted
    Lighthouse drops a silent peer after it, s).
    """

    def __init__(self, *, run_id: str, target_batch_size: int, optimizer, params=None,
                 batch_size_per_step: Optional[int] = None, scheduler=None,
                 grad_compression=None, state_averaging_compression=None, initial_peers=None,
                 matchmaking_time: float = 15.0, averaging_timeout: float = 60.0,
                 use_local_updates: bool = False, average_state_every: int = 1,
                 grad_averager_factory=None, reuse_grad_buffers: bool = False,
                 error_feedback: Optional[bool] = None, host: Optional[str] = None,
                 host_maddrs=None, heartbeat_timeout: float = 2.0, verbose: bool = False,
                 **hivemind_only) -> None:  # fmt: skip
        extra = arguments.check_hivemind_only(hivemind_only)
        if not isinstance(run_id, str) or not run_id:
            raise ValueError(f"run_id must be a non-empty string, got {run_id!r}")
        n = arguments.check_number
        self.target_batch_size = n("target_batch_size", target_batch_size, 1, integer=True)
        if batch_size_per_step is not None:
            n("batch_size_per_step", batch_size_per_step, 1, integer=True)
        n("matchmaking_time", matchmaking_time, 0.0)
        n("averaging_timeout", averaging_timeout, 0.0, low_open=True)
        n("average_state_every", average_state_every, 1, integer=True)
        n("heartbeat_timeout", heartbeat_timeout, 0.0, low_open=True)
        if grad_averager_factory is not None and use_local_updates:
            raise ValueError("grad_averager_factory averages gradients: it does not go with "
                             "use_local_updates=True (parameters are averaged)")  # fmt: skip
        self.optimizer, self.params = arguments.make_optimizer(optimizer, params)
        self.scheduler = arguments.make_scheduler(scheduler, self.optimizer)
        self.run_id, self.batch_size_per_step = run_id, batch_size_per_step
        self.use_local_updates = bool(use_local_updates)
        self.average_state_every = average_state_every
        self.reuse_grad_buffers, self.verbose = bool(reuse_grad_buffers), bool(verbose)
        shapes = [tuple(p.shape) for p in self.params]
        if self.use_local_updates:
            self.codec = wire.Codec(state_averaging_compression, shapes, TensorRole.PARAMETER)
        else:
            self.codec = wire.Codec(grad_compression, shapes, TensorRole.GRADIENT)
        self.averager = grad_averager_factory(self.params) if grad_averager_factory else None
        if self.averager is not None and not hasattr(self.averager, "process_group"):
            raise ValueError(
                "grad_averager_factory must make an averager with a process_group "
                "attribute and step() (torch_cgx.averaging.PowerSGDGradientAverager)"
            )
        feedback = [False] * len(shapes) if self.averager else self.codec.biased
        if error_feedback is not None:
            feedback = [bool(error_feedback)] * len(shapes)
        self.error_feedback = feedback
        self.state = PeerState(self)
        self._rate = progress.Rate()
        if extra.get("performance_ema_alpha") is not None:
            self._rate.smooth = float(extra["performance_ema_alpha"])
        self.local_epoch = 0
        self.healed = False  # the last round healed this peer from a live one
        self.rounds_discarded = 0
        self.last_round: dict = {}
        self._by_payloads = False  # average by whole payloads (a compressor too large to re-encode)
        self._samples, self._counted, self._quota = 0, 0, None
        self._batch = batch_size_per_step or 0
        self._connect(initial_peers, host, host_maddrs, matchmaking_time, averaging_timeout,
                      heartbeat_timeout)  # fmt: skip
        self._since = time.monotonic()
        self._join()

    def _join(self, tries: int = 3) -> None:
        """The first quorum (a heal from a live peer), no samples; run again while it fails (a
        peer died while the quorum re-formed, the heal's source among them: the next quorum is
        without it), at most ``tries`` times."""
        healed = False
        for _ in range(tries):
            discarded = self.rounds_discarded
            self._round()
            healed = healed or self.healed
            if self.rounds_discarded == discarded:
                break
        self.healed = healed

    # --- rendezvous -------------------------------------------------------------------------

    def _connect(self, initial_peers, host, host_maddrs, matchmaking, timeout, heartbeat):
        target = rendezvous.join_address(initial_peers)
        self.lighthouse = None
        me = rendezvous.local_host(target[0] if target else None, host, host_maddrs)
        if target is None:
            self.lighthouse = rendezvous.Lighthouse(
                me, join_timeout=matchmaking, heartbeat_timeout=heartbeat
            )
            target = (me, self.lighthouse.port)
            print(f"torch_cgx.collaborative: peers join with initial_peers="
                  f"{self.lighthouse.address!r}", flush=True)  # fmt: skip
        self.address = f"{target[0]}:{target[1]}"
        self.manager, self._store = rendezvous.make_manager(
            target, me, self.run_id, timeout=timeout, quorum_timeout=max(60.0, 4 * timeout)
        )
        self.manager.register_state_dict_fn(KEY, self.state.load_from_peer, self.state.for_peer)

    # --- the training loop's calls ----------------------------------------------------------

    def step(self, closure=None, batch_size: Optional[int] = None):
        """Counts one micro-batch of ``batch_size`` samples (its gradients, or with local
        updates an optimizer step); runs a round when this peer's share of the epoch is done.
        Returns the closure's loss."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        size = batch_size if batch_size is not None else self.batch_size_per_step
        if size is None:
            raise ValueError("step(): pass batch_size= (or batch_size_per_step= to Optimizer)")
        arguments.check_number("batch_size", size, 1, integer=True)
        if self.use_local_updates:
            self.optimizer.step()
        else:
            self.state.accumulate(size)
        self._samples += size
        self._batch = size
        if self._quota is None or self._samples >= self._quota:
            self._round()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        if not self.reuse_grad_buffers:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def load_state_from_peers(self) -> None:
        """Drops this peer's unsent samples and takes part in a round without them: a peer
        behind the collaboration (it missed epochs) receives a live peer's state; one in step
        with it already holds that state."""
        self.state.drop_samples()
        self._samples = self._counted = 0
        self._round()

    # --- a round ----------------------------------------------------------------------------

    def _round(self) -> None:
        now = time.monotonic()
        self._rate.add(self._samples - self._counted, now - self._since)
        self._counted = self._samples
        started = time.perf_counter()
        self.healed = False
        try:
            self.manager.start_quorum()
        except Exception as e:  # no quorum: the Lighthouse is gone or unreachable
            raise RuntimeError(
                f"collaborative round: no quorum from the Lighthouse at {self.address} (is the "
                f"rendezvous up? the peer that hosted it may have left): {e}"
            ) from e
        quorum = time.perf_counter() - started
        if self.healed:
            self._samples = self._counted = 0
        samples = self._samples if self.manager.is_participating() else 0
        every = self.average_state_every
        averaging = not self.use_local_updates or (self.local_epoch + 1) % every == 0
        average, table, sent = None, None, 0
        self._times = {"quorum": quorum}
        try:
            table, average, sent = self._exchange(samples, averaging)
        except butterfly.TooLarge as e:  # the same on every peer: all switch together
            self._by_payloads = True
            _log.warning("collaborative round failed (not committed): %s", e)
            self.manager.report_error(e)
        except Exception as e:  # a peer gone, a timeout, a corrupted payload: not committed
            _log.warning("collaborative round failed (not committed): %s", e)
            self.manager.report_error(e)
        committed = self.manager.should_commit()
        self._finish_round(committed, table, average, sent, time.perf_counter() - started)
        self.last_round["phases"] = self._times  # seconds: quorum, header, reduce_scatter, ...

    def _exchange(self, samples: int, averaging: bool):
        """The round's traffic: ``(header table, average or None, bytes sent)``."""
        head = (samples, self._rate.value or 0.0, self._batch)
        if self.averager is not None or not averaging:  # the header alone
            table, _, sent = wire.gather_round(self.manager, (*head, 0), None)
            if averaging and sum(int(r[0]) for r in table):
                return table, self.state.average_with(self.averager, table, self.manager), sent
            return table, None, sent
        if self._by_payloads:  # whole payloads, all-gathered
            payload = self.state.encode() if samples else None
            size = 0 if payload is None else payload.numel()
            table, payloads, sent = wire.gather_round(self.manager, (*head, size), payload)
            return table, wire.average(self.codec, table, payloads)[0], sent
        values = self.state.values() if samples else None
        feedback = any(self.error_feedback)
        table, average, own, sent = butterfly.reduce(
            self.manager, self.codec, values, head, self._times, decode_own=feedback
        )
        self.state.pending_from(values, own)
        return table, average, sent

    def _finish_round(self, committed, table, average, sent, seconds) -> None:
        stepped = False
        if committed and table is not None:
            total = sum(int(r[0]) for r in table)
            if total > 0:
                self._apply(average)
                stepped = True
                self._samples = self._counted = 0
            self._rate.close_epoch()
            counts = progress.batches_per_peer([r[:3] for r in table], self.target_batch_size,
                                               self._batch or 1)  # fmt: skip
            self._quota = counts[wire.rank_of(self.manager)] * max(self._batch, 1)
            self.last_round = {"peers": len(table), "samples": total, "seconds": seconds,
                               "bytes_sent": sent, "table": table}  # fmt: skip
        else:
            self.rounds_discarded += 1
            self.state.discard_round()
        self._since = time.monotonic()
        if stepped and self.verbose:
            r = self.last_round
            print(f"torch_cgx.collaborative: epoch {self.local_epoch}: {r['samples']} samples "
                  f"from {r['peers']} peers, round {r['seconds']:.3f} s", flush=True)  # fmt: skip

    def _apply(self, average) -> None:
        if self.use_local_updates:
            if average is not None:
                self.state.set_parameters(average)
        else:
            self.state.set_gradients(average)
            self.optimizer.step()
            self.state.after_step()
        if self.scheduler is not None:
            self.scheduler.step()
        self.local_epoch += 1

    # --- state ------------------------------------------------------------------------------

    def state_dict(self) -> dict:
        """This peer's optimizer state, epoch, scheduler, residuals (a checkpoint)."""
        return self.state.checkpoint()

    def load_state_dict(self, state: dict) -> None:
        self.state.restore(state)

    def shutdown(self) -> None:
        """Leaves the collaboration (the others drop this peer at their next round)."""
        manager, self.manager = getattr(self, "manager", None), None
        if manager is not None:
            manager.shutdown(wait=False)
        if getattr(self, "lighthouse", None) is not None:
            self.lighthouse.shutdown()
            self.lighthouse = None

    def __enter__(self) -> Optimizer:
        return self

    def __exit__(self, *exc) -> None:
        self.shutdown()

    @property
    def param_groups(self):
        return self.optimizer.param_groups
