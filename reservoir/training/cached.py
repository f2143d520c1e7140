"""Training a linear head on cached features at the cost of the head itself.

Lu et al.'s Table 10 speedup ("caches the features, then trains a linear
output layer") is only real when a cached step costs what the head's
arithmetic costs. :class:`CachedHead` keeps the features and labels resident
on the device as single tensors, takes each epoch's order as one device
tensor, and runs every step as a handful of fused tensor operations: the
softmax cross-entropy gradient in closed form, gradient-norm clipping, and
Adam as PyTorch's fused kernel (one call for all tensors; written out as a
fallback, the same bias-corrected update with ``eps`` outside the square
root). No step does numpy indexing, host transfers, ``.item()`` or autograd
bookkeeping; the loss is summed on the device and read once per evaluation.
On CUDA, runs of :data:`GRAPH_STEPS` steps are captured once as a CUDA graph
and replayed: the rows of all those steps are gathered into the graph's input
buffers by one ``index_select`` each for features and labels, every step
writes its picked log-probabilities into a slice of one buffer that the
graph's last two kernels add to the loss, so a step is ten small kernels (the
logits, log-softmax, the pick, the gradient's 1/n, exp and scatter, two
products, the step count and fused Adam) and no launches from the host.

``reservoir train --from-store`` on a last-token store runs it through
:func:`reservoir.training.train_cached`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from reservoir.training.data import epoch_permutation


#: Steps one CUDA graph replay runs (an epoch's remainder runs eagerly).
GRAPH_STEPS = 32
#: Largest input buffer (the features of :data:`GRAPH_STEPS` batches) a graph holds; larger batches run eagerly
#: (they are not launch-bound).
GRAPH_MAX_BYTES = 256 << 20


@dataclass
class _Graph:
    """A captured run of :data:`GRAPH_STEPS` steps and its input buffers (features and labels of its batches)."""

    replay: Callable[[], None]  # runs the captured steps on what x and y hold
    x: torch.Tensor  # (GRAPH_STEPS * batch, n_out * d)
    y: torch.Tensor  # (GRAPH_STEPS * batch, n_out * n_heads)


class CachedHead:
    """Adam on a linear head over resident features ``X`` ``(N, n_out, n_dim)`` and labels ``Y``.

    The head maps each of the ``n_out`` positions to ``n_heads * n_classes``
    logits; the loss is the mean cross-entropy over every label element, as in
    live training (:func:`reservoir.training.loss_fn`).

    Parameters
    ----------
    head : nn.Linear
        ``n_dim -> n_heads * n_classes``; its weights are updated in place.
    X : torch.Tensor
        ``(N, n_out, n_dim)`` features (final norm applied), float32, on the head's device.
    Y : torch.Tensor
        ``(N, n_out, n_heads)`` (or anything reshaping to it) int64 labels, same device.
    n_classes : int
        Classes per label element.
    lr, betas, eps : float
        Adam's settings (PyTorch defaults but ``lr``).
    grad_clip : float
        Gradient-norm clip (0: none), computed on the device.
    cuda_graphs : bool
        On CUDA with the fused Adam kernel, replay captured runs of
        :data:`GRAPH_STEPS` steps (the same arithmetic as the eager steps).

    Examples
    --------
    >>> head = nn.Linear(8, 3)
    >>> X, Y = torch.randn(64, 1, 8), torch.randint(0, 3, (64, 1, 1))
    >>> trainer = CachedHead(head, X, Y, n_classes=3, lr=1e-2)
    >>> trainer.run(trainer.epoch_order(seed=0, epoch=0), batch_size=16)
    4
    """

    def __init__(self, head: nn.Linear, X: torch.Tensor, Y: torch.Tensor, n_classes: int, lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8, grad_clip: float = 0.0,
                 cuda_graphs: bool = True):
        self.head, self.C = head, n_classes
        self.N, self.n_out, self.d = X.shape
        self.X = X.reshape(self.N, self.n_out * self.d)  # (N, n_out * d): one gather per step
        self.n_heads = head.out_features // n_classes
        self.Y = Y.reshape(self.N, self.n_out * self.n_heads)  # (N, n_out * n_heads)
        self.lr, self.betas, self.eps, self.grad_clip = lr, betas, eps, grad_clip
        self.params = [head.weight, head.bias]
        self.m = [torch.zeros_like(p) for p in self.params]
        self.v = [torch.zeros_like(p) for p in self.params]
        self.t = 0
        self.steps = [torch.zeros((), device=X.device) for _ in self.params]  # for the fused kernel
        self._fused = hasattr(torch, "_fused_adam_")
        self.loss_sum = torch.zeros((), device=X.device)
        self.loss_steps = 0
        self.cuda_graphs = cuda_graphs and X.device.type == "cuda"
        self._graphs: dict[int, _Graph | None] = {}  # batch size -> captured run and its buffers (None: eager)
        self._minus_one: dict[int, torch.Tensor] = {}  # label elements per batch -> (n, 1) of -1/n (the one-hot)
        self.why_eager: str | None = None

    def epoch_order(self, seed: int, epoch: int) -> torch.Tensor:
        """Epoch ``epoch``'s row order: the permutation live training uses (:func:`.epoch_permutation`)."""
        return torch.from_numpy(epoch_permutation(self.N, seed, epoch)).to(self.X.device)

    def step(self, rows: torch.Tensor) -> None:
        """One Adam step on the batch ``rows`` (a device tensor of row indices)."""
        B = len(rows)
        xb = self.X.index_select(0, rows).view(B * self.n_out, self.d)  # (B*n_out, d)
        y = self.Y.index_select(0, rows).view(-1, 1)  # (B*n_out*n_heads, 1)
        self._one_hot_values(len(y))
        picked = self._update(xb, y)
        self.loss_sum.sub_(picked.sum(), alpha=1 / len(y))
        self.loss_steps += 1

    def _one_hot_values(self, n: int) -> None:
        """Make the ``(n, 1)`` column of -1/n a step of ``n`` label elements scatters (once, outside any capture)."""
        if n not in self._minus_one:
            self._minus_one[n] = torch.full((n, 1), -1.0 / n, dtype=self.X.dtype, device=self.X.device)

    @torch.no_grad()
    def _update(self, xb: torch.Tensor, y: torch.Tensor, picked: torch.Tensor | None = None) -> torch.Tensor:
        """One step's device work on gathered features ``xb`` ``(B*n_out, d)`` and labels ``y`` ``(n, 1)``; returns
        the log-probabilities of the labels ``(n, 1)`` (written into ``picked`` when given), whose negative mean is
        the step's loss. What a CUDA graph captures."""
        W, b = self.params
        n = len(y)
        logits = torch.addmm(b, xb, W.t()).view(-1, self.C)  # (n, C)
        logp = torch.log_softmax(logits, dim=-1)
        picked = torch.gather(logp, 1, y, out=picked) if picked is not None else logp.gather(1, y)
        # (softmax - onehot) / n = d loss / d logits, the 1/n inside the exponent and the one-hot's column
        g = logp.sub_(math.log(n)).exp_().scatter_add_(1, y, self._minus_one[n])
        g = g.view(xb.shape[0], -1)  # (B*n_out, n_heads*C)
        grads = [g.t() @ xb, g.sum(0)]  # (n_heads*C, d), (n_heads*C,)
        if self.grad_clip > 0:
            norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads)))
            coef = (self.grad_clip / (norm + 1e-6)).clamp_(max=1.0)
            torch._foreach_mul_(grads, coef)
        self._adam(grads)
        return picked

    def _adam(self, grads: list[torch.Tensor]) -> None:
        b1, b2 = self.betas
        self.t += 1
        if self._fused:  # one kernel for both tensors (CPU and CUDA builds of torch have it)
            torch._foreach_add_(self.steps, 1)
            try:
                torch._fused_adam_(self.params, grads, self.m, self.v, [], self.steps, lr=self.lr, beta1=b1,
                                   beta2=b2, weight_decay=0.0, eps=self.eps, amsgrad=False, maximize=False)
                return
            except (AttributeError, RuntimeError, NotImplementedError):
                self._fused = False  # the written-out update below, from this step on
        step_size = self.lr / (1 - b1**self.t)
        bc2_sqrt = math.sqrt(1 - b2**self.t)
        torch._foreach_lerp_(self.m, grads, 1 - b1)
        torch._foreach_mul_(self.v, b2)
        torch._foreach_addcmul_(self.v, grads, grads, value=1 - b2)
        denom = torch._foreach_sqrt(self.v)
        torch._foreach_div_(denom, bc2_sqrt)
        torch._foreach_add_(denom, self.eps)
        torch._foreach_addcdiv_(self.params, self.m, denom, value=-step_size)

    def run(self, order: torch.Tensor, batch_size: int, start: int = 0, stop: int | None = None) -> int:
        """Steps over consecutive batches of ``order`` (whole batches only, as live training); returns the count."""
        per_epoch = max(1, len(order) // batch_size)
        stop = per_epoch if stop is None else min(stop, per_epoch)
        i = start
        if self.cuda_graphs and self.t > 0:  # after an eager step: kernels, handles and the fused kernel known to work
            while stop - i >= GRAPH_STEPS and self._fused:
                graph = self._graph(batch_size)
                if graph is None:
                    break
                rows = order[i * batch_size : (i + GRAPH_STEPS) * batch_size]
                torch.index_select(self.X, 0, rows, out=graph.x)
                torch.index_select(self.Y, 0, rows, out=graph.y)
                graph.replay()
                self.t += GRAPH_STEPS
                self.loss_steps += GRAPH_STEPS
                i += GRAPH_STEPS
        for j in range(i, stop):
            self.step(order[j * batch_size : (j + 1) * batch_size])
        return stop - start

    def _graph(self, batch_size: int) -> _Graph | None:
        """The captured run of :data:`GRAPH_STEPS` steps at ``batch_size`` (captured on first use), or ``None``."""
        if batch_size not in self._graphs:
            self._graphs[batch_size] = self._captured_run(batch_size)
        return self._graphs[batch_size]

    def _captured_run(self, batch_size: int) -> _Graph | None:
        rows, dev = GRAPH_STEPS * batch_size, self.X.device
        if rows * self.X.shape[1] * self.X.element_size() > GRAPH_MAX_BYTES:
            return None  # eager: large batches are not launch-bound
        x = torch.zeros(rows, self.X.shape[1], dtype=self.X.dtype, device=dev)
        y = torch.zeros(rows, self.Y.shape[1], dtype=self.Y.dtype, device=dev)
        n = batch_size * self.n_out * self.n_heads
        picked = torch.zeros(GRAPH_STEPS, n, 1, dtype=self.X.dtype, device=dev)  # each step's picked log-probabilities
        self._one_hot_values(n)

        def steps() -> None:
            for k in range(GRAPH_STEPS):
                batch = slice(k * batch_size, (k + 1) * batch_size)
                self._update(x[batch].view(-1, self.d), y[batch].reshape(-1, 1), picked[k])
            self.loss_sum.sub_(picked.sum(), alpha=1 / n)

        t = self.t
        try:
            replay = self._capture(steps)
        except RuntimeError as err:  # go on eagerly
            torch.cuda.synchronize(dev)
            self.cuda_graphs = False
            self.why_eager = f"CUDA graph capture failed ({str(err).splitlines()[0][:200]})"
            return None
        finally:
            self.t = t  # capture ran no step
        if not self._fused:  # the fused kernel failed inside the capture: the graph holds the host-counted update
            self.cuda_graphs, self.why_eager = False, "the fused Adam kernel was refused during capture"
            return None
        return _Graph(replay, x, y)

    @staticmethod
    def _capture(body: Callable[[], None]) -> Callable[[], None]:
        """``body``'s kernels captured as one CUDA graph (not run); returns what replays them."""
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            body()
        return graph.replay  # holds the graph

    def mean_loss(self) -> float:
        """Mean training loss since the last call (one read from the device)."""
        value = float(self.loss_sum) / max(self.loss_steps, 1)
        self.loss_sum.zero_()
        self.loss_steps = 0
        return value

    @torch.no_grad()
    def correct_rows(self, X: torch.Tensor, Y: torch.Tensor) -> tuple[np.ndarray, int]:
        """Correct label elements of every row of resident ``X`` ``(M, n_out, d)``, ``Y``, and elements per row."""
        logits = self.head(X).view(len(X), -1, self.C)  # (M, n_out*n_heads, C)
        right = logits.argmax(-1) == Y.reshape(len(X), -1)
        return right.sum(1).cpu().numpy(), right.shape[1]

    @torch.no_grad()
    def accuracy(self, X: torch.Tensor, Y: torch.Tensor) -> float:
        """Share of label elements predicted right on resident ``X`` ``(M, n_out, d)``, ``Y``."""
        correct, heads = self.correct_rows(X, Y)
        return int(correct.sum()) / max(len(correct) * heads, 1)


def resident(X: np.ndarray, Y: np.ndarray, n_out: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Features ``(N*n_out, d)`` and labels as stored by ``load_layer`` -> one float32 and one int64 device tensor."""
    N = len(X) // n_out
    Xt = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32)).view(N, n_out, -1).to(device)
    Yt = torch.from_numpy(np.ascontiguousarray(Y, dtype=np.int64)).reshape(N, -1).to(device)
    return Xt, Yt

