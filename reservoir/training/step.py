"""One training step with no host stall: batches prepared ahead, the loss kept on the device, fused Adam, CUDA graphs.

:class:`Stepper` is what :func:`reservoir.training.train` (and ``reservoir
bench train``) runs per optimizer step:

* **Batches ahead of the step.** On CUDA a split whose arrays fit
  :data:`RESIDENT_BYTES` is copied to the device once; a step's batch is then
  a gather there, its row indices sent from pinned memory without waiting.
  Other splits (a split-point store's states, large inputs) are read by one
  background thread a few steps ahead, into pinned memory on CUDA.
  Padding lengths and whether a batch is padded come from the host's copy of
  the lengths, so no step asks the device anything.
* **The loss stays on the device**: summed there, read once per validation
  (:meth:`Stepper.mean_loss`).
* **Fused Adam** where the device has it (CUDA, and CPUs in recent torch),
  the foreach implementation elsewhere; gradient-norm clipping without a
  host read. Under fp16 autocast (``--amp fp16`` on CUDA) the loss is scaled
  by a ``torch.amp.GradScaler`` (gradients unscaled before clipping, a step
  with non-finite gradients skipped on the device), and the steps run eagerly.
* **CUDA graphs** (``cuda_graphs="auto"``): when every training row has the
  same length (bit XOR, bit memory, images), the whole step (gather, forward,
  loss, backward, clipping, Adam) is captured once after a few eager steps
  and replayed, so a step costs one launch however small the model's
  kernels are. Variable-length tasks (ListOps) run eagerly: their shapes
  change every batch, and their steps are compute-bound anyway.

The batches, their order and the arithmetic are the eager loop's, so a
graph-captured run trains the same weights (tested on CUDA).
"""

from __future__ import annotations

import queue
import threading
from typing import Any

import numpy as np
import torch
from torch import nn

from reservoir import options
from reservoir.errors import ReservoirError
from reservoir.runtime import attention_backends, autocast, compute_dtype
from reservoir.training.classifier import ReservoirClassifier, loss_fn
from reservoir.training.data import EpochOrder, Feeder

#: The largest split (inputs, lengths and labels) kept resident on a CUDA device for training.
RESIDENT_BYTES = 2 * 2**30
#: Eager steps before a CUDA graph is captured (optimizer state created, kernels chosen, allocator warm).
GRAPH_WARMUP_STEPS = 3
#: Batches a background reader keeps ready for a split that is not resident.
PREFETCH = 4
GRAPH_CHOICES = options.CUDA_GRAPHS


def adam(params: list[nn.Parameter], lr: float, device: torch.device) -> torch.optim.Adam:
    """Adam over ``params``: the fused kernel where the device has one (capturable on CUDA), else foreach.

    On CUDA the optimizer keeps its step counts on the device (``capturable``),
    so the same optimizer serves eager steps and a captured CUDA graph with the
    same arithmetic.
    """
    if device.type == "cuda":
        return torch.optim.Adam(params, lr=lr, fused=True, capturable=True)
    try:
        return torch.optim.Adam(params, lr=lr, fused=True)
    except (RuntimeError, ValueError):  # a torch without the CPU kernel
        return torch.optim.Adam(params, lr=lr, foreach=True)


def restore_optimizer_flags(opt: torch.optim.Optimizer, fused: bool | None, capturable: bool) -> None:
    """After ``load_state_dict``: the implementation flags this run chose, and step counts where they need to be.

    A checkpoint's param groups carry the flags of the run that wrote it
    (possibly an older, unfused one); its step counts live on the CPU unless
    that run kept them on the device.
    """
    for group in opt.param_groups:
        group["fused"], group["capturable"] = fused, capturable
        for p in group["params"]:
            state = opt.state.get(p)
            if state and "step" in state:
                step = float(state["step"])
                on_device = capturable or bool(fused)
                state["step"] = torch.tensor(step, dtype=torch.float32, device=p.device if on_device else "cpu")


class Batch:
    """One step's batch on the device: ``x``, ``lengths``, ``y``, and what the host knows (``L``, ``padded``)."""

    __slots__ = ("x", "lengths", "y", "L", "padded")

    def __init__(self, x, lengths, y, L: int, padded: bool):
        self.x, self.lengths, self.y, self.L, self.padded = x, lengths, y, L, padded


class Batches:
    """A split's batches for steps ``start, start+1, ...``, prepared ahead of the step that uses them.

    Resident (CUDA, arrays within :data:`RESIDENT_BYTES`): the split lives on
    the device and :meth:`next` sends only the step's row indices. Otherwise a
    background thread gathers (and, on CUDA, pins) the next batches while the
    current step runs; :meth:`next` starts their copy without waiting.
    """

    def __init__(self, feeder: Feeder, device: torch.device, batch_size: int, seed: int, start: int = 0,
                 resident_bytes: int = RESIDENT_BYTES):
        self.feeder, self.device = feeder, device
        self.order = EpochOrder(len(feeder), batch_size, seed)
        self.step = start
        self.lengths = np.asarray(feeder.lengths)
        self.cuda = device.type == "cuda"
        self.resident = None
        if self.cuda and isinstance(feeder.inputs, np.ndarray):
            size = feeder.inputs.nbytes + feeder.lengths.nbytes + feeder.labels.nbytes
            if size <= resident_bytes:
                x = torch.from_numpy(np.ascontiguousarray(feeder.inputs))
                if x.dtype == torch.float16:
                    x = x.float()
                self.resident = (x.to(device), torch.from_numpy(self.lengths.astype(np.int64)).to(device),
                                 torch.from_numpy(np.asarray(feeder.labels).astype(np.int64)).to(device))
        self._queue: queue.Queue | None = None
        self._stop = threading.Event()
        if self.resident is None:
            self._queue = queue.Queue(maxsize=PREFETCH)
            self._thread = threading.Thread(target=self._read, args=(start,), name="reservoir-batches", daemon=True)
            self._thread.start()

    @property
    def fixed_length(self) -> int | None:
        """The one length every row has, or ``None`` when lengths vary."""
        lo, hi = int(self.lengths.min()), int(self.lengths.max())
        return hi if lo == hi else None

    def rows(self, step: int) -> np.ndarray:
        return self.order.rows(step)

    def _read(self, step: int) -> None:
        """Background: host batches of ``step, step+1, ...`` (pinned on CUDA) into the queue, until stopped."""
        while not self._stop.is_set():
            try:
                rows = self.order.rows(step)
                x, lengths, y = self.feeder.batch(rows, "cpu")
                if self.cuda:
                    x, lengths, y = x.pin_memory(), lengths.pin_memory(), y.pin_memory()
                item: Any = (rows, x, lengths, y)
            except BaseException as err:  # noqa: BLE001 - handed to the training thread
                item = err
            while not self._stop.is_set():
                try:
                    self._queue.put(item, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if isinstance(item, BaseException):
                return
            step += 1

    def index(self, rows: np.ndarray) -> torch.Tensor:
        """``rows`` as a device index tensor, sent from pinned memory without waiting."""
        t = torch.from_numpy(np.ascontiguousarray(rows, dtype=np.int64))
        return t.pin_memory().to(self.device, non_blocking=True) if self.cuda else t

    def next(self) -> Batch:
        """The batch of the next step."""
        step, self.step = self.step, self.step + 1
        if self.resident is not None:
            rows = self.rows(step)
            lens = self.lengths[rows]
            L = int(lens.max())
            idx = self.index(rows)
            X, Ls, Y = self.resident
            return Batch(X[idx, :L], Ls[idx], Y[idx], L, bool(lens.min() < L))
        item = self._next_item()
        if isinstance(item, BaseException):
            raise item
        rows, x, lengths, y = item
        lens = self.lengths[rows]
        L = int(lens.max())
        nb = self.cuda
        return Batch(x.to(self.device, non_blocking=nb), lengths.to(self.device, non_blocking=nb),
                     y.to(self.device, non_blocking=nb), L, bool(lens.min() < L))

    def _next_item(self) -> Any:
        """The reader's next item; a reader that ended without one (it cannot, but a wait forever would hide it) is
        an error, not a hang."""
        assert self._queue is not None
        while True:
            try:
                return self._queue.get(timeout=1.0)
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("the background batch reader ended without a batch") from None

    def close(self) -> None:
        """Stop the background reader (if any)."""
        self._stop.set()
        if self._queue is not None:
            self._thread.join()


class Stepper:
    """Optimizer steps of ``model`` on the batches of ``feeder``, from step ``start`` on.

    Parameters
    ----------
    model : ReservoirClassifier
        Frozen as the run asks, on ``device``.
    opt : torch.optim.Optimizer
        Built by :func:`adam` over the trainable parameters.
    feeder : Feeder
        The training split.
    device : torch.device
    batch_size, seed : int
        Batch order as :func:`reservoir.training.batch_rows`.
    amp : str
        Autocast on CUDA (:func:`reservoir.runtime.autocast`); fp16 adds a
        gradient scaler (:attr:`scaler`).
    grad_clip : float
        Gradient-norm clip (0: none).
    start : int
        The first step (a resumed run's).
    cuda_graphs : {"auto", "on", "off"}
        ``auto``: capture the step as a CUDA graph where the rows all have one
        length and the split is resident on a CUDA device; ``on``: the same,
        but refuse (one line) where it cannot; ``off``: always eager.
    scaler_state : dict, optional
        A gradient scaler's ``state_dict`` to go on from (a resumed fp16 run's).

    Examples
    --------
    >>> from reservoir.backbones import load_backbone
    >>> model = ReservoirClassifier(load_backbone("tiny-gpt2", d_in=3), 1, 1, 2)
    >>> model.head.requires_grad_(True)  # doctest: +ELLIPSIS
    Linear(...)
    >>> feeder = Feeder(np.zeros((32, 5, 3), np.float32), np.full(32, 5), np.zeros(32, np.int64))
    >>> device = torch.device("cpu")
    >>> stepper = Stepper(model, adam(list(model.head.parameters()), 1e-3, device), feeder, device, 8, 0)
    >>> stepper.run(4); round(stepper.mean_loss(), 2) > 0
    True
    >>> stepper.close()
    """

    def __init__(self, model: ReservoirClassifier, opt: torch.optim.Optimizer, feeder: Feeder, device: torch.device,
                 batch_size: int, seed: int, amp: str = "auto", grad_clip: float = 0.0, start: int = 0,
                 cuda_graphs: str = "auto", compile: bool = False, scaler_state: dict[str, Any] | None = None):
        if cuda_graphs not in GRAPH_CHOICES:
            raise ReservoirError(f"unknown CUDA graphs setting {cuda_graphs!r}; expected one of: "
                                 f"{', '.join(GRAPH_CHOICES)}")
        self.model, self.opt, self.device, self.amp = model, opt, device, amp
        # the compiled forward (torch.compile, shapes dynamic: batches vary in length); a graph capture is skipped
        self.forward = torch.compile(model, dynamic=True) if compile else model
        self.compiled = compile
        self.start = feeder.start
        self.params = [p for p in model.parameters() if p.requires_grad]
        self.grad_clip = grad_clip
        # fp16 gradients of small losses underflow: scale the loss, unscale before clipping, skip non-finite steps
        self.scaler: torch.amp.GradScaler | None = None
        if device.type == "cuda" and compute_dtype(device, amp) == torch.float16:
            self.scaler = torch.amp.GradScaler(device.type)
            if scaler_state:
                self.scaler.load_state_dict(scaler_state)
        self.batches = Batches(feeder, device, batch_size, seed, start)
        self.loss_sum = torch.zeros((), device=device)
        self.loss_steps = 0
        self.graph: torch.cuda.CUDAGraph | None = None
        self._static_rows: torch.Tensor | None = None
        try:
            self.why_eager = self._why_eager(cuda_graphs)
        except ReservoirError:
            self.batches.close()  # its reader thread would wait forever for room in its queue
            raise
        self.use_graph = self.why_eager is None
        self._eager_steps = 0

    def _why_eager(self, setting: str) -> str | None:
        """Why the steps cannot (or are not to) be captured; ``None`` when they will be."""
        if self.compiled:
            why = "the forward is compiled (--compile)"
        elif self.scaler is not None:
            why = "fp16 steps scale the loss (GradScaler), which a captured step does not hold"
        elif self.device.type != "cuda":
            why = f"the device is {self.device.type}, not CUDA"
        elif self.batches.resident is None:
            why = "the training split is not resident on the device"
        elif self.batches.fixed_length is None:
            why = "the training rows differ in length"
        else:
            return "turned off" if setting == "off" else None
        if setting == "on":
            raise ReservoirError(f"--cuda-graphs on needs a CUDA device, a resident training split, rows of one length "
                                 f"and no --amp fp16; found {why}")
        return why

    # -- one eager step ------------------------------------------------------------------------------
    def _forward_backward(self, x, lengths, y, padded: bool, cache: bool = True) -> None:
        with autocast(self.device, self.amp, cache=cache), attention_backends(self.device):
            logits = self.forward(x, lengths, self.start, padded=padded)
        loss = loss_fn(logits, y)
        if self.scaler is None:
            loss.backward()
        else:
            self.scaler.scale(loss).backward()
            self.scaler.unscale_(self.opt)  # clipping sees the true gradients
        if self.grad_clip > 0:
            torch.nn.utils.clip_grad_norm_(self.params, self.grad_clip, foreach=self.device.type == "cuda" or None)
        if self.scaler is None:
            self.opt.step()
        else:  # fused Adam takes the scaler's found-inf flag: a non-finite step is skipped on the device, no host read
            self.scaler.step(self.opt)
            self.scaler.update()
        self.loss_sum += loss.detach()

    def _eager(self, batch: Batch) -> None:
        self.opt.zero_grad(set_to_none=True)
        self._forward_backward(batch.x, batch.lengths, batch.y, batch.padded)

    # -- the captured step ---------------------------------------------------------------------------
    def _capture(self) -> None:
        """Record one step reading its rows from ``_static_rows``: gather, forward, backward, clip, Adam."""
        X, Ls, Y = self.batches.resident
        L = self.batches.fixed_length
        B = len(self.batches.rows(self.batches.step))
        self._static_rows = torch.zeros(B, dtype=torch.int64, device=self.device)
        torch.cuda.synchronize(self.device)
        self.opt.zero_grad(set_to_none=True)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            idx = self._static_rows
            self._forward_backward(X[idx, :L], Ls[idx], Y[idx], False, cache=False)
        self.graph = graph

    def step(self) -> None:
        """One optimizer step on the next batch."""
        if self.graph is None and self.use_graph and self._eager_steps >= GRAPH_WARMUP_STEPS:
            self._try_capture()
        if self.graph is not None:
            rows = self.batches.rows(self.batches.step)
            self.batches.step += 1
            self._static_rows.copy_(self.batches.index(rows), non_blocking=True)
            self.graph.replay()
            self.loss_steps += 1
            return
        batch = self.batches.next()
        if self.use_graph:  # the eager steps before a capture run on a side stream, as capture asks
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self._eager(batch)
            torch.cuda.current_stream(self.device).wait_stream(side)
        else:
            self._eager(batch)
        self._eager_steps += 1
        self.loss_steps += 1

    def _try_capture(self) -> None:
        try:
            self._capture()
        except RuntimeError as err:  # an op the graph cannot hold: go on eagerly, saying so once
            torch.cuda.synchronize(self.device)
            self.opt.zero_grad(set_to_none=True)
            self.graph, self.use_graph = None, False
            self.why_eager = f"CUDA graph capture failed ({str(err).splitlines()[0][:200]})"
            print(f"training steps run eagerly: {self.why_eager}")

    def run(self, n: int) -> None:
        """``n`` steps."""
        for _ in range(n):
            self.step()

    def mean_loss(self) -> float:
        """Mean training loss since the last call: the one read of the device's running sum."""
        value = float(self.loss_sum) / max(self.loss_steps, 1)
        self.loss_sum.zero_()
        self.loss_steps = 0
        return value

    @property
    def mode(self) -> str:
        """``"cuda-graph"`` once the step is captured (after :data:`GRAPH_WARMUP_STEPS` eager steps), ``"compiled"``
        with ``compile``, else ``"eager"``."""
        return "cuda-graph" if self.graph is not None else "compiled" if self.compiled else "eager"

    def close(self) -> None:
        self.batches.close()
        self.graph = None
