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
and replayed (a step is then a dozen small kernels and no launches from the
host), with the rows of those steps copied into the graph's index buffer in
one device copy.

``reservoir train --from-store`` on a last-token store runs it through
:func:`reservoir.training.train_cached`.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import nn


#: Steps one CUDA graph replay runs (an epoch's remainder runs eagerly).
GRAPH_STEPS = 32


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
        self._graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}  # batch size -> graph, rows buffer
        self.why_eager: str | None = None

    def epoch_order(self, seed: int, epoch: int) -> torch.Tensor:
        """Epoch ``epoch``'s row order, the permutation live training uses (:func:`reservoir.training.batch_rows`)."""
        perm = np.random.default_rng([seed, epoch]).permutation(self.N)
        return torch.from_numpy(perm).to(self.X.device)

    def step(self, rows: torch.Tensor) -> None:
        """One Adam step on the batch ``rows`` (a device tensor of row indices)."""
        self._step(rows)
        self.loss_steps += 1

    @torch.no_grad()
    def _step(self, rows: torch.Tensor) -> None:
        """The step's device work alone (what a CUDA graph captures)."""
        W, b = self.params
        B = len(rows)
        xb = self.X.index_select(0, rows).view(B * self.n_out, self.d)  # (B*n_out, d)
        logits = torch.addmm(b, xb, W.t()).view(-1, self.C)  # (B*n_out*n_heads, C)
        logp = torch.log_softmax(logits, dim=-1)
        y = self.Y.index_select(0, rows).view(-1, 1)  # (B*n_out*n_heads, 1)
        self.loss_sum -= logp.gather(1, y).sum() / len(y)
        g = logp.exp_().scatter_add_(1, y, torch.full_like(y, -1, dtype=logp.dtype))  # softmax - onehot
        g = g.div_(len(y)).view(B * self.n_out, -1)  # (B*n_out, n_heads*C): d loss / d logits
        grads = [g.t() @ xb, g.sum(0)]  # (n_heads*C, d), (n_heads*C,)
        if self.grad_clip > 0:
            norm = torch.linalg.vector_norm(torch.stack([torch.linalg.vector_norm(x) for x in grads]))
            coef = (self.grad_clip / (norm + 1e-6)).clamp_(max=1.0)
            torch._foreach_mul_(grads, coef)
        self._adam(grads)

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
                captured = self._graph(batch_size)
                if captured is None:
                    break
                graph, rows = captured
                rows.copy_(order[i * batch_size : (i + GRAPH_STEPS) * batch_size])
                graph.replay()
                self.t += GRAPH_STEPS
                self.loss_steps += GRAPH_STEPS
                i += GRAPH_STEPS
        for j in range(i, stop):
            self.step(order[j * batch_size : (j + 1) * batch_size])
        return stop - start

    def _graph(self, batch_size: int) -> tuple[torch.cuda.CUDAGraph, torch.Tensor] | None:
        """The captured run of :data:`GRAPH_STEPS` steps at ``batch_size`` (captured on first use), or ``None``."""
        if batch_size in self._graphs:
            return self._graphs[batch_size]
        rows = torch.zeros(GRAPH_STEPS * batch_size, dtype=torch.int64, device=self.X.device)
        graph = torch.cuda.CUDAGraph()
        t = self.t
        try:
            with torch.cuda.graph(graph):
                for k in range(GRAPH_STEPS):
                    self._step(rows[k * batch_size : (k + 1) * batch_size])
        except RuntimeError as err:  # go on eagerly
            torch.cuda.synchronize(self.X.device)
            self.cuda_graphs = False
            self.why_eager = f"CUDA graph capture failed ({str(err).splitlines()[0][:200]})"
            return None
        finally:
            self.t = t  # capture ran no step
        if not self._fused:  # the fused kernel failed inside the capture: the graph holds the host-counted update
            self.cuda_graphs, self.why_eager = False, "the fused Adam kernel was refused during capture"
            return None
        self._graphs[batch_size] = (graph, rows)
        return self._graphs[batch_size]

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
        logits = self.head(X).view(len(X), -1, self.C)  # (M, n_out*n_heads, C)
        right = logits.argmax(-1) == Y.reshape(len(X), -1)
        return int(right.sum()) / max(right.numel(), 1)


def resident(X: np.ndarray, Y: np.ndarray, n_out: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Features ``(N*n_out, d)`` and labels as stored by ``load_layer`` -> one float32 and one int64 device tensor."""
    N = len(X) // n_out
    Xt = torch.from_numpy(np.ascontiguousarray(X, dtype=np.float32)).view(N, n_out, -1).to(device)
    Yt = torch.from_numpy(np.ascontiguousarray(Y, dtype=np.int64)).reshape(N, -1).to(device)
    return Xt, Yt

