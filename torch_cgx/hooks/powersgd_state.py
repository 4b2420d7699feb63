"""State of torch_cgx's PowerSGD hooks: torch's ``PowerSGDState`` parameters and defaults, with
memory keyed so that it survives DDP's bucket rebuild and a checkpoint.

torch's state keys its error feedback and Q matrices by bucket index; DDP rebuilds its buckets
after the first iteration, and a resumed process starts again from the initial buckets, so a
restored state no longer fits (a size mismatch). Here they are keyed by parameter name (give
``module=`` or call :meth:`attach`), by parameter identity otherwise. ``torch.save(state)``
writes plain numbers, strings, lists, dicts and tensors (the seed generator's state as a tensor),
so ``torch.load(..., weights_only=True)`` reads it back.

Without a module, identities mean nothing in another process, so the state is saved as torch
saves its own: by place in DDP's gradient buckets, each parameter's memory under
``".bucket.<index>.<position>"`` in the last gradient buckets the hook saw (no parameter name
starts with a dot). After loading, the first time the hook sees gradient bucket ``index`` with
the parameter shapes it had when saved, its memory is bound to that bucket's parameters.
torch's caveat applies: the resumed DDP must form the same gradient buckets (same model,
``bucket_cap_mb`` and gradient-ready order), or memory lands on another parameter of the same
shape. Give ``module=`` (or call :meth:`attach`) to be free of the buckets.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Optional, Tuple

import torch
import torch.distributed as dist

logger = logging.getLogger(__name__)

_CONFIG = (
    "matrix_approximation_rank",
    "start_powerSGD_iter",
    "min_compression_rate",
    "use_error_feedback",
    "warm_start",
    "orthogonalization_epsilon",
    "random_seed",
    "compression_stats_logging_frequency",
    "batch_tensors_with_same_shape",
    "quantize_bits",
    "quantize_bucket_size",
)
_COUNTERS = ("iter", "total_numel_before_compression", "total_numel_after_compression",
             "next_stats_report")  # fmt: skip


def _check_int(name: str, value, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")


def _check_number(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
        raise ValueError(f"{name} must be a number >= 0, got {value!r}")


class PowerSGDState:
    """torch's ``PowerSGDState`` (same parameters, defaults and checks) for
    :func:`torch_cgx.hooks.powerSGD_hook` and :func:`torch_cgx.hooks.batched_powerSGD_hook`.

    Extra keyword arguments:
        module: the model, to key the memory by parameter name (needed to checkpoint it).
        quantize_bits: 1..8 sends P and Q quantized with max-min (cgx groups only); None: exact.
        quantize_bucket_size: values per max-min bucket of P and Q (default 512).
    """

    __slots__ = _CONFIG + _COUNTERS + (
        "process_group", "rng", "error_dict", "q_memory_dict", "seen_buckets", "_names",
        "_pending", "_buckets", "_saved_buckets",
    )  # fmt: skip

    def __init__(
        self,
        process_group: Optional[dist.ProcessGroup],
        matrix_approximation_rank: int = 1,
        start_powerSGD_iter: int = 1_000,
        min_compression_rate: float = 2,
        use_error_feedback: bool = True,
        warm_start: bool = True,
        orthogonalization_epsilon: float = 0,
        random_seed: int = 0,
        compression_stats_logging_frequency: int = 10_000,
        batch_tensors_with_same_shape: bool = False,
        *,
        module: Optional[torch.nn.Module] = None,
        quantize_bits: Optional[int] = None,
        quantize_bucket_size: int = 512,
    ) -> None:
        _check_int("matrix_approximation_rank", matrix_approximation_rank, 1)
        _check_int("start_powerSGD_iter", start_powerSGD_iter, 0)
        _check_number("min_compression_rate", min_compression_rate)
        _check_number("orthogonalization_epsilon", orthogonalization_epsilon)
        _check_int("random_seed", random_seed, 0)
        _check_int("compression_stats_logging_frequency", compression_stats_logging_frequency, 0)
        for name in ("use_error_feedback", "warm_start", "batch_tensors_with_same_shape"):
            if not isinstance(locals()[name], bool):
                raise ValueError(f"{name} must be a bool, got {locals()[name]!r}")
        if quantize_bits is not None:
            _check_int("quantize_bits", quantize_bits, 1)
            if quantize_bits > 8:
                raise ValueError(f"quantize_bits must be 1..8 or None, got {quantize_bits!r}")
        _check_int("quantize_bucket_size", quantize_bucket_size, 1)
        if (use_error_feedback or warm_start) and start_powerSGD_iter <= 1:
            raise ValueError(
                "Expect `start_powerSGD_iter` > 1 if `use_error_feedback` or `warm_start` is "
                "enabled, because PowerSGD can only be applied after the first two iterations "
                "in DDP."
            )
        import numpy as np  # torch's state draws its seeds from numpy's generator: same seeds

        self.process_group = process_group
        self.matrix_approximation_rank = matrix_approximation_rank
        self.start_powerSGD_iter = start_powerSGD_iter
        self.min_compression_rate = min_compression_rate
        self.use_error_feedback = use_error_feedback
        self.warm_start = warm_start
        self.orthogonalization_epsilon = orthogonalization_epsilon
        self.random_seed = random_seed
        self.compression_stats_logging_frequency = max(1, compression_stats_logging_frequency)
        self.batch_tensors_with_same_shape = batch_tensors_with_same_shape
        self.quantize_bits = quantize_bits
        self.quantize_bucket_size = quantize_bucket_size
        self.rng = np.random.RandomState(random_seed)
        self.error_dict: Dict[Any, torch.Tensor] = {}
        self.q_memory_dict: Dict[Any, torch.Tensor] = {}
        self.seen_buckets: set = set()
        self.iter = 0
        self.total_numel_before_compression = 0
        self.total_numel_after_compression = 0
        self.next_stats_report = 0
        self._names: Dict[int, str] = {}
        self._pending: List = []
        # bucket index -> (keys, shapes) of its parameters, as the hook last saw it; and, in a
        # state loaded without names, the shapes of the saved buckets not bound yet.
        self._buckets: Dict[int, Tuple[tuple, tuple]] = {}
        self._saved_buckets: Dict[int, tuple] = {}
        if module is not None:
            self.attach(module, process_group)

    def attach(self, module: torch.nn.Module, process_group=None) -> None:
        """The model whose parameter names key the memory (after loading, or when the state was
        made without ``module=``), and the group (None: the default)."""
        self._names = {id(p): name for name, p in module.named_parameters()}
        self.process_group = process_group

    def key(self, param: torch.Tensor):
        return self._names.get(id(param), id(param))

    def bucket_keys(self, bucket: dist.GradBucket) -> tuple:
        """The keys of ``bucket``'s parameters; remembers the bucket's layout (for saving) and
        binds saved memory of this bucket index to them (see the module docstring)."""
        params = bucket.parameters()
        keys = tuple(self.key(p) for p in params)
        shapes = tuple(tuple(p.shape) for p in params)
        index = bucket.index()
        if index == 0:  # a new step (DDP hands the buckets over in index order): a new layout
            self._buckets = {}
        self._buckets[index] = (keys, shapes)
        if self._saved_buckets.get(index) == shapes:
            del self._saved_buckets[index]
            self._rename({_place(index, j): k for j, k in enumerate(keys)})
        return keys

    def _rename(self, names: Dict[Any, Any]) -> None:
        """Renames memory keys (and the parts of tuple keys: the batched hook's, the bucket
        signatures) by ``names``."""

        def new(key):
            if isinstance(key, tuple):
                return tuple(names.get(k, k) for k in key)
            return names.get(key, key)

        self.error_dict = {new(k): v for k, v in self.error_dict.items()}
        self.q_memory_dict = {new(k): v for k, v in self.q_memory_dict.items()}
        self.seen_buckets = {new(sig) for sig in self.seen_buckets}

    def maybe_increase_iter(self, bucket: dist.GradBucket) -> None:
        """Counts a step when the last bucket of an iteration is reduced (torch's rule)."""
        if bucket.is_last():
            self.iter += 1
            if self.iter == self.start_powerSGD_iter:
                logger.info("Start to apply PowerSGD after %s iterations.", self.iter)

    def compression_stats(self):
        """(compression rate, values before, values after), as torch's state reports them."""
        before, after = self.total_numel_before_compression, self.total_numel_after_compression
        return (before / after if after > 0 else 0, before, after)

    def report_stats(self) -> None:
        if self.iter >= self.next_stats_report:
            rate, before, after = self.compression_stats()
            logger.info(
                "Compression stats: iter %s, total before compression %s, total after "
                "compression %s, rate %s", self.iter, before, after, rate,
            )  # fmt: skip
            self.next_stats_report = self.iter + self.compression_stats_logging_frequency

    def _places(self) -> Tuple[Dict[Any, str], Dict[int, list]]:
        """For saving: (identity key -> its place in the buckets, bucket index -> the shapes of
        its parameters) for every bucket whose memory is saved by place."""
        places, shapes = {}, {i: [list(s) for s in sh] for i, sh in self._saved_buckets.items()}
        for index, (keys, bucket_shapes) in self._buckets.items():
            if all(isinstance(k, str) for k in keys):
                continue
            shapes[index] = [list(s) for s in bucket_shapes]
            places.update(
                {k: _place(index, j) for j, k in enumerate(keys) if not isinstance(k, str)}
            )
        return places, shapes

    def __getstate__(self) -> Dict[str, Any]:
        places, shapes = self._places()

        def saved(key):  # a name, a place, or a tuple of them (the batched hook's keys)
            if isinstance(key, tuple):
                return tuple(saved(k) for k in key)
            if isinstance(key, str):  # a parameter name, or a place not bound yet
                return key
            if key not in places:
                raise ValueError(
                    "PowerSGDState holds memory of a parameter in none of the buckets it saw "
                    "last: create it with module=model (or call state.attach(model)) to "
                    "checkpoint it"
                )
            return places[key]

        _, keys_, pos, has_gauss, gauss = self.rng.get_state()
        state = {name: getattr(self, name) for name in _CONFIG + _COUNTERS}
        state.update(
            rng={
                "keys": torch.from_numpy(keys_.astype("int64")),
                "pos": int(pos),
                "has_gauss": int(has_gauss),
                "gauss": float(gauss),
            },  # fmt: skip
            error_dict={saved(k): v.clone() for k, v in self.error_dict.items()},
            q_memory_dict={saved(k): v.clone() for k, v in self.q_memory_dict.items()},
            seen_buckets=sorted(list(saved(sig)) for sig in self.seen_buckets),
            bucket_shapes=shapes,
        )
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        import numpy as np

        for name in _CONFIG + _COUNTERS:
            setattr(self, name, state[name])
        rng = state["rng"]
        self.rng = np.random.RandomState()
        keys = rng["keys"].numpy().astype(np.uint32)
        self.rng.set_state(("MT19937", keys, rng["pos"], rng["has_gauss"], rng["gauss"]))
        self.error_dict = dict(state["error_dict"])
        self.q_memory_dict = dict(state["q_memory_dict"])
        self.seen_buckets = {tuple(sig) for sig in state["seen_buckets"]}
        self.process_group = None  # set it again (attach), as for torch's states
        self._names, self._pending, self._buckets = {}, [], {}
        # Saved by an older version: no places.
        shapes = state.get("bucket_shapes", {})
        self._saved_buckets = {int(i): tuple(tuple(s) for s in sh) for i, sh in shapes.items()}


def _place(index: int, position: int) -> str:
    """The key of a parameter's memory saved by place: a parameter name never starts with a
    dot (``register_parameter`` and ``add_module`` refuse dots and empty names)."""
    return f".bucket.{index}.{position}"


# torch.load(weights_only=True), torch's default, accepts the state (plain data and tensors).
torch.serialization.add_safe_globals([PowerSGDState])
