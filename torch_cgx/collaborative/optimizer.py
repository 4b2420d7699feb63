"""``torch_cgx.collaborative.Optimizer``: hivemind's Optimizer on torchft, every peer bitwise
equal after every epoch (docs/collaborative.md)."""

from __future__ import annotations

import logging
import time
from typing import Optional

import torch

from torch_cgx.collaborative import arguments, butterfly, progress, rendezvous, wire
from torch_cgx.collaborative.background import in_background
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
            late to a round before it starts the round without them (s; counted from the
            first request, which may precede the last round's end by ``averaging_timeout``:
            its join timeout is the sum of the two).
        averaging_timeout: a round's collectives and state transfer (s): a peer that dies or
            stalls in a round is dropped within it.
        use_local_updates: step the optimizer on every ``step()`` and average the parameters
            every ``average_state_every`` epochs (hivemind's local-updates mode).
        grad_averager_factory: ``factory(params)`` -> an averager of ``p.grad`` such as
            ``partial(PowerSGDGradientAverager, averager_rank=32)``.
        reuse_grad_buffers: ``step()`` consumes and zeroes ``p.grad`` (do not call
            ``zero_grad``); False: call ``zero_grad()`` after ``step()`` as usual.
        verbose: print one line per epoch.
        delay_grad_averaging, delay_optimizer_step: run each round (the average and the
            commit) in the background while ``step()`` goes on accumulating the next epoch's
            gradients; the optimizer steps with the average at the first ``step()`` after the
            round ends (one epoch stale, as hivemind's; either flag turns it on). The samples
            computed while a round runs all go into the next epoch (at least the target).
    torch_cgx's own: ``wait_for_round`` (with the delay: a peer whose next share is done
    before the round ends waits for it in ``step()``, as hivemind's does, so an epoch stays the
    planned batch; default False: it goes on computing),
    ``error_feedback`` (None: for biased compressors), ``host`` /
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
                 delay_grad_averaging: bool = False, delay_optimizer_step: Optional[bool] = None,
                 wait_for_round: bool = False, **hivemind_only) -> None:  # fmt: skip
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
        self.delayed = arguments.check_delay(delay_grad_averaging, delay_optimizer_step,
                                             use_local_updates, grad_averager_factory,
                                             wait_for_round)  # fmt: skip
        self.wait_for_round = bool(wait_for_round)
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
        self.healed = False  # the last finished round healed this peer from a live one
        self.rounds_discarded = 0
        self.last_round: dict = {}
        self._by_payloads = False  # average by whole payloads (a compressor too large to re-encode)
        self._samples, self._fresh, self._quota = 0, 0, None  # _fresh: not in the rate yet
        self._inflight = None  # the background round (delay_grad_averaging)
        self._round_limit = averaging_timeout + matchmaking_time + heartbeat_timeout
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
        if target is None:  # late is measured from a round's end: the first request may come
            # from a peer the last round left out, a whole round (averaging_timeout) earlier
            self.lighthouse = rendezvous.Lighthouse(
                me, join_timeout=matchmaking + timeout, heartbeat_timeout=heartbeat
            )
            target = (me, self.lighthouse.port)
            print(f"torch_cgx.collaborative: peers join with initial_peers="
                  f"{self.lighthouse.address!r}", flush=True)  # fmt: skip
        self.address = f"{target[0]}:{target[1]}"
        # a quorum forms within the Lighthouse's join timeout of its first request; one that
        # takes a round's limit has no Lighthouse (a peer leaving waits no longer at exit)
        self.manager, self._store = rendezvous.make_manager(
            target, me, self.run_id, timeout=timeout, quorum_timeout=max(self._round_limit, 10.0)
        )
        self.manager.register_state_dict_fn(KEY, self.state.load_from_peer, self.state.for_peer)

    # --- the training loop's calls ----------------------------------------------------------

    def step(self, closure=None, batch_size: Optional[int] = None):
        """Counts one micro-batch of ``batch_size`` samples (its gradients, or with local
        updates an optimizer step); runs a round when this peer's share of the epoch is done
        (with ``delay_grad_averaging``: starts it in the background, and applies a finished
        one). Returns the closure's loss."""
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
        self._fresh += size
        self._batch = size
        if self._inflight is not None:
            share_done = self._quota is not None and self._samples >= self._quota
            if not self._inflight.done() and not (share_done and self.wait_for_round):
                return loss  # the samples go on into the next epoch
            self._collect()  # waits (wait_for_round) when the next share is done first
        if self._quota is None or self._samples >= self._quota:
            if self.delayed:
                self._launch()
            else:
                self._round()
        return loss

    def zero_grad(self, set_to_none: bool = True) -> None:
        if not self.reuse_grad_buffers:
            self.optimizer.zero_grad(set_to_none=set_to_none)

    def load_state_from_peers(self) -> None:
        """Drops this peer's unsent samples and takes part in a round without them: a peer
        behind the collaboration (it missed epochs) receives a live peer's state; one in step
        with it already holds that state."""
        if self._inflight is not None:
            self._collect()
        self.state.drop_samples()
        self._samples = 0
        self._round()

    # --- a round: begun and finished by the training loop, run by it or in the background ---

    def _round(self) -> None:
        self._finish(self._run(self._begin()))

    def _launch(self) -> None:
        job = self._begin()
        self.state.deferring = True
        self._inflight = in_background(self._run, job)

    def _collect(self) -> None:
        """Applies the background round (waits for it if it is still running). The wait and
        the step are not compute: they are left out of this peer's rate, as a synchronous
        round's time is (else the plan gives a waiting peer a share it cannot compute)."""
        future, self._inflight = self._inflight, None
        start = time.monotonic()
        try:
            job = future.result()
        finally:
            self.state.deferring = False
        self._finish(job)
        self._since += time.monotonic() - start

    def _begin(self) -> dict:
        """Takes this peer's samples for a round (training thread)."""
        now = time.monotonic()
        self._rate.add(self._fresh, now - self._since)
        self._since, self._fresh = now, 0
        job = {"samples": self._samples, "acc": self.state.take(), "started": time.perf_counter()}
        self._samples = 0
        return job

    def _run(self, job: dict) -> dict:
        """The quorum, the average and the commit vote (writes no parameter or optimizer
        state: it may run beside the training loop)."""
        self.state.heal_received = False
        try:
            self.manager.start_quorum()
        except Exception as e:  # no quorum: the Lighthouse is gone or unreachable
            raise RuntimeError(
                f"collaborative round: no quorum from the Lighthouse at {self.address} (is the "
                f"rendezvous up? the peer that hosted it may have left): {e}"
            ) from e
        self._times = {"quorum": time.perf_counter() - job["started"]}
        job["healed"] = self.state.heal_received
        if job["healed"]:  # behind the others: its samples were computed on stale parameters
            job["samples"] = 0
        samples = job["samples"] if self.manager.is_participating() else 0
        every = self.average_state_every
        averaging = not self.use_local_updates or (self.local_epoch + 1) % every == 0
        job.update(table=None, average=None, sent=0)
        try:
            job["table"], job["average"], job["sent"] = self._exchange(samples, averaging, job)
        except butterfly.TooLarge as e:  # the same on every peer: all switch together
            self._by_payloads = True
            _log.warning("collaborative round failed (not committed): %s", e)
            self.manager.report_error(e)
        except Exception as e:  # a peer gone, a timeout, a corrupted payload: not committed
            _log.warning("collaborative round failed (not committed): %s", e)
            self.manager.report_error(e)
        job["committed"] = self.manager.should_commit()
        job["seconds"] = time.perf_counter() - job["started"]
        job["phases"] = self._times  # seconds: quorum, header, reduce_scatter, ...
        return job

    def _exchange(self, samples: int, averaging: bool, job: dict):
        """The round's traffic: ``(header table, average or None, bytes sent)``."""
        head = (samples, self._rate.value or 0.0, self._batch)
        acc = job["acc"]
        if self.averager is not None or not averaging:  # the header alone
            table, _, sent = wire.gather_round(self.manager, (*head, 0), None)
            if averaging and sum(int(r[0]) for r in table):
                average = self.state.average_with(self.averager, table, self.manager, acc)
                return table, average, sent
            return table, None, sent
        if self._by_payloads:  # whole payloads, all-gathered
            payload = self.state.encode(acc, samples) if samples else None
            size = 0 if payload is None else payload.numel()
            table, payloads, sent = wire.gather_round(self.manager, (*head, size), payload)
            return table, wire.average(self.codec, table, payloads)[0], sent
        values = self.state.values(acc, samples) if samples else None
        feedback = any(self.error_feedback)
        table, average, own, sent = butterfly.reduce(
            self.manager, self.codec, values, head, self._times, decode_own=feedback
        )
        self.state.pending_from(values, own)
        return table, average, sent

    def _finish(self, job: dict) -> None:
        """Applies a round's outcome (training thread)."""
        self.healed = job["healed"]
        if self.state.apply_heal():
            self._samples = 0  # computed on stale parameters
        table, stepped = job["table"], False
        if job["committed"] and table is not None:
            total = sum(int(r[0]) for r in table)
            if total > 0:
                self._apply(job["average"])
                stepped = True
            self._rate.close_epoch()
            counts = progress.batches_per_peer([r[:3] for r in table], self.target_batch_size,
                                               self._batch or 1)  # fmt: skip
            self._quota = counts[wire.rank_of(self.manager)] * max(self._batch, 1)
            self.last_round = {"peers": len(table), "samples": total, "seconds": job["seconds"],
                               "bytes_sent": job["sent"], "table": table}  # fmt: skip
            self.state.recycle(job["acc"])
        else:
            self.rounds_discarded += 1
            self.state.discard_round()
            if job["healed"]:
                self.state.recycle(job["acc"])
            else:  # nothing a peer computed is lost: sent at the next round
                self.state.give_back(job["acc"])
                self._samples += job["samples"]
        self.last_round["phases"] = job["phases"]
        if not self.delayed:
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
        """Leaves the collaboration (the others drop this peer at their next round). A
        background round still running is finished first and applied (within
        ``averaging_timeout + matchmaking_time + heartbeat_timeout``, else dropped): a peer
        leaves between rounds, its parameters those of the last epoch it took part in."""
        inflight, self._inflight = getattr(self, "_inflight", None), None
        if inflight is not None:
            try:
                inflight.result(timeout=self._round_limit)
                self._inflight = inflight
                self._collect()
            except Exception as e:  # a timeout, or the round's own error: leave anyway
                _log.warning("collaborative: left with a round unfinished: %r", e)
            self._inflight = None
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
