"""Sparse Top-K key selection for the NAC layer (paper §2.2, "Input curation").

Every strategy returns ``idx`` ``[B, H, Tq, K]``: the key position chosen for each
(query, slot), or ``-1`` where the slot holds no valid key (fewer valid keys than K,
a causal prefix, a padding mask). Which keys a query may see is decided by
:class:`Visibility`: causality, a sliding window and a per-key validity mask.

* :func:`select_exact`: full dot-product scores, chunked over queries so that memory
  stays ``O(chunk * Tk)``; with a causal window only the keys inside the window
  range of a chunk are scored.
* :func:`select_block`: the paper's square-root partitioning (Alg. 2): keys in
  ``ceil(sqrt(Tk))`` blocks, queries scored against block centroids, exact scoring
  inside the best blocks only. Subquadratic time, linear memory.
* :func:`select_all`: every visible key (NAC-PW); K = Tk, or the window's span.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

NO_KEY = -1

# Score-matrix elements per chunk of queries (per batch element and head). Bounds the
# memory of exact and block selection to O(T) instead of O(T^2).
CHUNK_ELEMENTS = 1 << 16


@dataclass(frozen=True)
class Visibility:
    """Which key positions a query position may attend to.

    causal: key j is visible to query i only if j <= i.
    window: if set, only keys with i - window < j (and, when not causal, j < i + window).
    key_valid: optional ``[B, Tk]`` bool, False for padding keys.
    """

    causal: bool = True
    window: int | None = None
    key_valid: torch.Tensor | None = None

    def key_range(self, q_start: int, q_end: int, num_keys: int) -> tuple[int, int]:
        """Half-open range of key positions any query in ``[q_start, q_end)`` may see."""
        lo = 0 if self.window is None else max(0, q_start - self.window + 1)
        if self.causal:
            hi = q_end
        elif self.window is None:
            hi = num_keys
        else:
            hi = q_end + self.window - 1
        return lo, min(hi, num_keys)

    def allowed(self, q_pos: torch.Tensor, k_pos: torch.Tensor) -> torch.Tensor:
        """Structural visibility ``[..., Tq, Tk']`` for query positions ``[Tq, 1]``-broadcastable
        against key positions (``k_pos`` may carry leading batch dims)."""
        ok = torch.ones(torch.broadcast_shapes(q_pos.shape, k_pos.shape), dtype=torch.bool, device=k_pos.device)
        if self.causal:
            ok &= k_pos <= q_pos
        if self.window is not None:
            ok &= k_pos > q_pos - self.window
            if not self.causal:
                ok &= k_pos < q_pos + self.window
        return ok


def topk_positions(scores: torch.Tensor, positions: torch.Tensor, topk: int) -> torch.Tensor:
    """Top-K of ``scores [B,H,C,N]`` (-inf = not allowed) -> global positions ``[B,H,C,topk]``.

    ``positions`` ``[..., N]`` (broadcastable) maps a candidate column to its key position.
    """
    k = min(topk, scores.shape[-1])
    best, col = scores.topk(k, dim=-1)
    pos = torch.gather(positions.expand(scores.shape), -1, col)
    pos = pos.masked_fill(best == float("-inf"), NO_KEY)
    if k < topk:
        pos = torch.nn.functional.pad(pos, (0, topk - k), value=NO_KEY)
    return pos


def _query_chunks(num_queries: int, per_query: int, window: int | None = None):
    """Query ranges of about CHUNK_ELEMENTS scores each. With a window, a chunk of C
    queries spans C + window keys, so chunks stay near the window's size."""
    chunk = max(1, CHUNK_ELEMENTS // max(per_query, 1))
    if window is not None:
        chunk = min(chunk, max(window, 32))
    for start in range(0, num_queries, chunk):
        yield start, min(start + chunk, num_queries)


def select_exact(q: torch.Tensor, k: torch.Tensor, topk: int, vis: Visibility,
                 q_offset: int = 0) -> torch.Tensor:
    """Exact Top-K by ``q_i . k_j``. q ``[B,H,Tq,D]``, k ``[B,H,Tk,D]`` -> idx ``[B,H,Tq,topk]``.

    ``q_offset`` is the position of the first query (queries are keys' positions
    ``q_offset .. q_offset + Tq - 1``).
    """
    B, H, Tq, _ = q.shape
    Tk = k.shape[2]
    out = []
    for start, end in _query_chunks(Tq, Tk, vis.window):
        lo, hi = vis.key_range(q_offset + start, q_offset + end, Tk)
        q_pos = torch.arange(q_offset + start, q_offset + end, device=q.device)[:, None]
        k_pos = torch.arange(lo, hi, device=q.device)
        if hi <= lo:
            out.append(torch.full((B, H, end - start, topk), NO_KEY, dtype=torch.long, device=q.device))
            continue
        scores = q[:, :, start:end] @ k[:, :, lo:hi].transpose(-1, -2)   # [B,H,C,hi-lo]
        allowed = vis.allowed(q_pos, k_pos)                                # [C, hi-lo]
        if vis.key_valid is not None:
            allowed = allowed & vis.key_valid[:, None, None, lo:hi]        # [B,1,C,hi-lo]
        scores = scores.masked_fill(~allowed, float("-inf"))
        out.append(topk_positions(scores, k_pos, topk))
    return torch.cat(out, dim=2)


def select_all(num_queries: int, num_keys: int, batch: int, heads: int, vis: Visibility,
               device: torch.device, q_offset: int = 0) -> torch.Tensor:
    """Every visible key. -> idx ``[B,H,Tq,K]`` with K = Tk, or the window's span."""
    q_pos = torch.arange(q_offset, q_offset + num_queries, device=device)[:, None]
    span = None if vis.window is None else (vis.window if vis.causal else 2 * vis.window - 1)
    if span is None or span >= num_keys:
        k_pos = torch.arange(num_keys, device=device).expand(num_queries, num_keys)
    else:  # a band of `span` positions ending (causal) or centred (not causal) at the query
        k_pos = q_pos - vis.window + 1 + torch.arange(span, device=device)            # [Tq, span]
    ok = vis.allowed(q_pos, k_pos) & (k_pos >= 0) & (k_pos < num_keys)
    ok = ok.expand(batch, 1, *ok.shape)
    if vis.key_valid is not None:
        ok = ok & torch.gather(vis.key_valid[:, None, :].expand(batch, num_queries, num_keys), 2,
                               k_pos.clamp(0, num_keys - 1).expand(batch, *k_pos.shape))[:, None]
    idx = torch.where(ok, k_pos, torch.full_like(k_pos, NO_KEY))
    return idx.expand(batch, heads, num_queries, k_pos.shape[-1])


def select_block(q: torch.Tensor, k: torch.Tensor, topk: int, vis: Visibility) -> torch.Tensor:
    """Square-root partitioned Top-K (paper Alg. 2). q ``[B,H,T,D]``, k ``[B,H,T,D]``.

    Keys are cut into ``ceil(sqrt(T))`` blocks of equal size. Each query always
    keeps its own block (its most recent keys) and adds the ``ceil(K / block)``
    other visible blocks whose mean key (centroid) scores best, then takes the exact
    Top-K inside those candidates. Under causality a query only ranks blocks that
    lie wholly in its past, so no centroid mixes in a future key. Returns the exact
    Top-K whenever the best keys lie in the chosen blocks.
    """
    B, H, T, D = q.shape
    size = max(1, math.ceil(math.sqrt(T)))
    n_blocks = math.ceil(T / size)
    pad = n_blocks * size - T
    key_ok = torch.ones(B, T, dtype=torch.bool, device=k.device) if vis.key_valid is None else vis.key_valid
    key_ok = torch.nn.functional.pad(key_ok, (0, pad), value=False)                  # [B, T']
    k_blocks = torch.nn.functional.pad(k, (0, 0, 0, pad)).view(B, H, n_blocks, size, D)
    weight = key_ok.view(B, 1, n_blocks, size, 1).to(k.dtype)
    count = weight.sum(dim=3)                                                         # [B,1,nb,1]
    centroids = (k_blocks * weight).sum(dim=3) / count.clamp(min=1)                   # [B,H,nb,D]
    block_has_keys = count[:, 0, :, 0] > 0                                            # [B, nb]
    block_first = torch.arange(n_blocks, device=k.device) * size                      # [nb]
    block_last = block_first + size - 1
    n_pick = min(n_blocks, math.ceil(topk / size) + 1)
    k_flat = k_blocks.view(B, H, n_blocks * size, D)
    in_block = torch.arange(size, device=k.device)

    out = []
    for start, end in _query_chunks(T, n_blocks + n_pick * size):
        q_c = q[:, :, start:end]                                                      # [B,H,C,D]
        q_pos = torch.arange(start, end, device=q.device)[:, None]                    # [C,1]
        own = q_pos // size                                                           # [C,1]
        # A block may be ranked if it overlaps the query's visible key interval; under
        # causality that interval ends before the query's own block.
        lo = q_pos - vis.window + 1 if vis.window is not None else torch.zeros_like(q_pos)
        if vis.causal:
            hi = own * size - 1
        else:
            hi = q_pos + vis.window - 1 if vis.window is not None else torch.full_like(q_pos, T - 1)
        rankable = (block_last >= lo) & (block_first <= hi)                           # [C,nb]
        block_scores = (q_c @ centroids.transpose(-1, -2))                            # [B,H,C,nb]
        block_scores = block_scores.masked_fill(~(rankable & block_has_keys[:, None, None, :]), float("-inf"))
        is_own = torch.arange(n_blocks, device=q.device) == own                       # [C,nb]
        block_scores = block_scores.masked_fill(is_own, float("inf"))
        top_scores, blocks = block_scores.topk(n_pick, dim=-1)                        # [B,H,C,n_pick]
        cand = (blocks[..., None] * size + in_block).flatten(-2)                      # [B,H,C,n_pick*size]
        cand_block_ok = (top_scores > float("-inf"))[..., None].expand(*blocks.shape, size).flatten(-2)
        cand_keys = torch.gather(k_flat[:, :, None].expand(B, H, end - start, n_blocks * size, D), 3,
                                 cand[..., None].expand(*cand.shape, D))
        scores = (cand_keys @ q_c[..., None])[..., 0]                                 # [B,H,C,n_pick*size]
        ok = cand_block_ok & vis.allowed(q_pos, cand) & (cand < T)
        ok &= torch.gather(key_ok[:, None, None, :].expand(B, H, end - start, -1), 3, cand)
        scores = scores.masked_fill(~ok, float("-inf"))
        out.append(topk_positions(scores, cand, topk))
    return torch.cat(out, dim=2)
