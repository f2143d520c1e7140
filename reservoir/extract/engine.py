"""The extraction engine: windows of rows through a frozen backbone on the device, features gathered there.

:class:`Engine` holds one pass's fixed parts (backbone, layers, output
positions, device, output dtype) and runs a window of rows: one upload, the
batches a length-sorted plan cuts it into, the hidden states at the last
``n_out_tokens`` real positions of every asked layer kept on the device.
:func:`to_host` starts the window's copy back into pinned memory.
:func:`extract_rows` is the same pass on arrays in memory, without a store.
"""

from __future__ import annotations

import numpy as np

from reservoir.errors import ReservoirError
from reservoir.extract.plan import plan_order
from reservoir.runtime import forward_context, resolve_device


def extract_rows(backbone, inputs: np.ndarray, lengths: np.ndarray, layers: list[int], n_out_tokens: int,
                 batch_size: int | None = None, device=None, amp: str = "auto", progress=None,
                 full_seq_layer: int | None = None, max_length: int | None = None, max_tokens: int | None = None):
    """Features ``(N, len(layers), n_out_tokens, n_dim)`` float32 for the given rows, bucketed by length;
    ``layers`` in increasing order, each once (the order the blocks produce them).

    With ``full_seq_layer`` also every position's state at that layer,
    ``(N, max_length, n_dim)`` zero-padded, as a second return value
    (``max_length`` defaults to the inputs' width ``inputs.shape[1]``). The
    backbone must already be on ``device`` (default CPU) in its compute dtype.
    """
    import torch

    if list(layers) != sorted(set(layers)):
        raise ReservoirError(f"expected layers in increasing order, each once (the order the blocks produce them), "
                             f"found {list(layers)}")
    if full_seq_layer is not None:
        if max_length is None:
            max_length = int(np.shape(inputs)[1])
        longest = int(np.max(lengths)) if len(lengths) else 0
        if longest > max_length:
            raise ReservoirError(f"expected max_length at least the longest sequence ({longest}) for the "
                                 f"full-sequence states, found {max_length}")
    device = torch.device("cpu") if device is None else resolve_device(device)
    if len(lengths) == 0:  # no rows: empty arrays of the shapes rows would have
        feats = np.zeros((0, len(layers), n_out_tokens, backbone.n_dim), np.float32)
        if full_seq_layer is None:
            return feats
        return feats, np.zeros((0, int(max_length or 0), backbone.n_dim), np.float32)
    engine = Engine(backbone, layers, n_out_tokens, device, torch.float32, full_seq_layer, max_length)
    with torch.inference_mode(), forward_context(backbone, device, amp):
        feats, states = engine.run(inputs, lengths, np.arange(len(lengths)), *plan_order(lengths, batch_size, max_tokens),
                                   progress=progress)
    feats = feats.cpu().numpy()
    return feats if full_seq_layer is None else (feats, states.cpu().numpy())


class Engine:
    """One extraction pass's fixed parts: runs windows of rows through the backbone on the device.

    ``run`` takes a window's rows, a length-sorted order and batch bounds
    (:func:`reservoir.extract.plan.plan_order`) and returns the features in the
    window's own row order, on the device, in ``out_dtype``. With
    ``keep=False`` it is the *bare forward*: the same uploads and forwards,
    nothing gathered or kept (what ``bench extract`` compares against).
    """

    def __init__(self, backbone, layers: list[int], n_out_tokens: int, device, out_dtype,
                 full_seq_layer: int | None = None, states_length: int | None = None,
                 poolings: tuple[str, ...] | None = None):
        self.backbone, self.layers, self.n_out = backbone, layers, n_out_tokens
        self.device, self.out_dtype = device, out_dtype
        self.full_seq_layer, self.states_length = full_seq_layer, states_length
        self.poolings = poolings  # None: the last real token(s) only, features (n, n_layers, n_out, n_dim)

    def upload(self, inputs: np.ndarray, lengths: np.ndarray, rows: np.ndarray):
        """``inputs[rows]`` (rows in length order), padded to the longest, on the device (one transfer)."""
        import torch

        L = int(lengths[rows[-1]])
        x = torch.from_numpy(np.ascontiguousarray(inputs[rows, :L]))  # (n, L[, d_in])
        lens = torch.from_numpy(np.ascontiguousarray(lengths[rows], dtype=np.int64))  # (n,)
        if self.device.type == "cuda":
            return x.pin_memory().to(self.device, non_blocking=True), lens.pin_memory().to(self.device, non_blocking=True)
        return x, lens

    def run(self, inputs: np.ndarray, lengths: np.ndarray, rows: np.ndarray, order: np.ndarray,
            bounds: list[tuple[int, int]], progress=None, keep: bool = True):
        """Features of ``inputs[rows]``: ``(n, n_layers, n_out, n_dim)`` (``(n, P, n_layers, n_out, n_dim)`` with
        ``poolings``) and states ``(n, states_length, n_dim)`` or ``None``, in the order of ``rows``; ``order``
        sorts ``lengths[rows]``, ``bounds`` cut it into batches.
        """
        import torch

        n, bb = len(order), self.backbone
        x, lens = self.upload(inputs, lengths, rows[order])
        sorted_len = lengths[rows[order]]
        full = self.full_seq_layer
        feats: torch.Tensor | None = None
        states: torch.Tensor | None = None
        if keep:
            shape: tuple[int, ...] = (len(self.layers), self.n_out, bb.n_dim)
            if self.poolings is not None:
                shape = (len(self.poolings), *shape)  # (P, n_layers, n_out, n_dim) per row
            feats = torch.empty((n, *shape), dtype=self.out_dtype, device=self.device)
            if full is not None:
                assert self.states_length is not None  # given with full_seq_layer
                states = torch.zeros((n, self.states_length, bb.n_dim), dtype=self.out_dtype, device=self.device)
        for lo, hi in bounds:
            L = int(sorted_len[hi - 1])
            res = bb.features(x[lo:hi, :L], lens[lo:hi], self.layers, self.n_out, full,
                              padded=bool(sorted_len[lo] < L), poolings=self.poolings)
            if feats is not None:
                f = res if full is None else res[0]  # (b, [P,] n_layers, n_out, n_dim)
                feats[lo:hi] = f.to(self.out_dtype)
                if states is not None:
                    pad = torch.arange(L, device=self.device)[None, :] >= lens[lo:hi, None]  # (b, L)
                    states[lo:hi, :L] = res[1].masked_fill(pad[..., None], 0).to(self.out_dtype)
            if progress is not None:
                progress.update(hi - lo)
        if feats is None:
            return None, None
        inv = torch.from_numpy(np.argsort(order))  # sorted position of each row
        if self.device.type == "cuda":  # pinned and asynchronous: a pageable copy would wait for the window's forwards
            inv = inv.pin_memory().to(self.device, non_blocking=True)
        return feats[inv], (None if states is None else states[inv])



def to_host(feats, states):
    """Start the window's copy to (pinned) host memory; return the host tensors and an event that marks it done."""
    import torch

    if feats.device.type != "cuda":
        return feats, states, None
    host = [None if t is None else torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in (feats, states)]
    for h, t in zip(host, (feats, states)):
        if t is not None:
            h.copy_(t, non_blocking=True)
    ready = torch.cuda.Event()
    ready.record()
    return host[0], host[1], ready
