"""Collaborative training of mixed, unreliable peers, the way hivemind's Optimizer promised it,
on torchft (optional: ``pip install torchft``).

>>> from torch_cgx.collaborative import Optimizer
>>> opt = Optimizer(run_id="my_run", optimizer=torch.optim.Adam, params=model.parameters(),
...                 target_batch_size=4096, batch_size_per_step=32,
...                 grad_compression=Float16Compression(), initial_peers=None)  # hosts
>>> for x, y in data:
...     loss_fn(model(x), y).backward(); opt.step(); opt.zero_grad()

The first peer (``initial_peers=None`` and no ``INITIAL_PEERS``) hosts the rendezvous, a torchft
Lighthouse, and prints its address; the others pass it. A global step (an epoch) runs when the
peers together have processed ``target_batch_size`` samples: their gradients' sample-weighted
average (compressed per tensor) steps every peer's optimizer, and every peer's parameters and
optimizer state are then bitwise the same. Slow peers get fewer samples per epoch
(:mod:`.progress`); a peer that dies is dropped within ``averaging_timeout``; a joining one
receives a live peer's state. ``python -m torch_cgx.collaborative --port 29510`` runs a
standalone Lighthouse. docs/collaborative.md has the whole story.
"""

from torch_cgx.collaborative.optimizer import Optimizer
from torch_cgx.collaborative.progress import plan
from torch_cgx.collaborative.rendezvous import Lighthouse

__all__ = ["Lighthouse", "Optimizer", "plan"]
