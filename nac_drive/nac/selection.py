"""Sparse Top-K key selection for the NAC layer (paper §2.2, "Input curation").

Every strategy returns ``idx`` ``[B, H, Tq, K]``: the key position chosen for each
(query, slot), or ``-1`` where the slot holds no valid key (fewer valid keys than K,
a causal prefix, a padding mask). Which keys a query may see is decided by
:class:`Visibility`: causality, a sliding window and a per-key validity mask.

* :func:`select_exact`: full dot-product scores, chunked over queries so that memory
  stays ``O(chunk * Tk)``; with a causal window only the keys inside the window
  range of a chunk are scored.
* :func:`select_block`: the paper's square-root partitioning (Alg. 2): keys in
  blocks of ``ceil(sqrt(Tk))`` keys, queries scored against block centroids, exact scoring
  inside the best blocks only. Subquadratic time, linear memory.
* :func:`select_all`: every visible key (NAC-PW); K = Tk, or the window's span.
* :func:`select_instead`: K visible keys chosen without q . k, the most recent or at random
  (interventions: what Top-K selection carries, :class:`~nac_drive.nac.clamp.Clamp`).

Among equal scores the newest key ranks first (a car standing still sends identical
frames; the newest of them is the one to read). This module is the torch reference and
the GPU path; on CPU :class:`~nac_drive.nac.layer.NAC` runs the numba kernels of
:mod:`~nac_drive.nac.kernels` instead, which return the same keys in the same order.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

NO_KEY = -1

# Score-matrix elements per chunk of queries (per batch element and head). Bounds the
# memory of exact and block selection to O(T) instead of O(T^2).
CHUNK_ELEMENTS = 1 << 16
# Block selection scores batches of (query group x block) products; a batch holds up to
# this many scores per query (B*H*T queries), so memory stays O(T) while long sequences
# still run in few, large batches.
PIECE_SCORES_PER_QUERY = 16


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
    """Top-K of ``scores [..., N]`` (-inf = not allowed) -> key positions ``[..., topk]``.

    ``positions`` ``[..., N]`` (broadcastable) maps a candidate column to its key position.
    """
    return _topk(scores, positions, topk)[1]


def _topk(scores: torch.Tensor, positions: torch.Tensor, topk: int) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`topk_positions` that also returns the scores ``[..., topk]`` (-inf where empty).
    Among equal scores the newest key (the larger position) ranks first."""
    k = min(topk, scores.shape[-1])
    positions = positions.expand(scores.shape)
    if scores.dtype in _PACKABLE and not (exporting() or torch.jit.is_tracing()):   # no dtype view in either
        col = _packed_top(scores, positions, k)
    else:
        col = _sorted_top(scores, positions, k)
    best = scores.gather(-1, col)
    pos = positions.gather(-1, col).masked_fill(best == float("-inf"), NO_KEY)
    if k < topk:
        best = torch.nn.functional.pad(best, (0, topk - k), value=float("-inf"))
        pos = torch.nn.functional.pad(pos, (0, topk - k), value=NO_KEY)
    return best, pos


# Scores that convert exactly to float32, whose 32 bits fit beside a key position in an int64.
_PACKABLE = (torch.float32, torch.float16, torch.bfloat16)


def _packed_top(scores: torch.Tensor, positions: torch.Tensor, k: int) -> torch.Tensor:
    """Columns ``[..., k]`` of the ``k`` best of ``scores [..., N]`` (float32 or narrower), best
    first, ties to the larger of ``positions [..., N]`` (below 2^32, and
    distinct in a row except where the score is -inf).

    Each score and its position pack into one int64 that orders as the rule ranks them (as
    :func:`nac_drive.nac._numba._pack` packs them): the float32 bits, sign-magnitude turned
    into two's complement, above the position. Packed values that tie are -inf candidates,
    which end up empty whichever ``topk`` picks, so ``topk``'s unspecified tie order is moot.
    """
    # NaN ranks first whatever its sign bit, as sort and topk rank it; -0.0 packs as 0.0.
    # In place: new buffers measured slower.
    bits = scores.detach().to(torch.float32, copy=True).nan_to_num_(math.nan, math.inf, -math.inf)
    bits = bits.view(torch.int32)
    sign = bits >> 31                                                   # -1 if negative, else 0
    ordered = bits.bitwise_and_(0x7FFFFFFF).bitwise_xor_(sign).sub_(sign)
    packed = ordered.to(torch.int64).bitwise_left_shift_(32).bitwise_or_(positions & 0xFFFFFFFF)
    return packed.topk(k, dim=-1).indices


def _sorted_top(scores: torch.Tensor, positions: torch.Tensor, k: int) -> torch.Tensor:
    """:func:`_packed_top` for any scores (float64), and traced (jit, export): the candidates
    ordered newest first, then stably by score. positions ``[..., N]`` as scores."""
    newest_first = _stable_top(positions, scores.shape[-1])[1]
    return newest_first.gather(-1, _stable_top(scores.gather(-1, newest_first), k)[1])


def _stable_top(values: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` largest of ``values [..., N]``, largest first, equal values in column order
    -> (values, columns) ``[..., k]``.

    Eagerly a stable sort. Traced for export (:func:`exporting`), ``topk``: ONNX has no
    stable sort (torch exports every sort, stable or not, as one), and its TopK puts equal
    values in index order (the ONNX spec's tie rule), the same order. torch's own ``topk``
    promises no order among ties, so eagerly it only ranks distinct values (:func:`_packed_top`).
    """
    if exporting():
        return values.topk(k, dim=-1)
    best, col = values.sort(dim=-1, descending=True, stable=True)
    return best[..., :k], col[..., :k]


def exporting() -> bool:
    """``torch.export`` (and so ``torch.onnx.export(dynamo=True)``) is tracing this code."""
    return _is_exporting()


_is_exporting = getattr(torch.compiler, "is_exporting", lambda: False)


def _query_chunks(num_queries: int, per_query: int, window: int | None = None):
    """Query ranges of about CHUNK_ELEMENTS scores each. With a window, a chunk of C
    queries spans C + window keys, so chunks stay near the window's size."""
    chunk = max(1, CHUNK_ELEMENTS // max(per_query, 1))
    if window is not None:
        chunk = min(chunk, max(window, 32))
    if num_queries <= chunk:   # one chunk, said without range(): an export keeps T a variable
        yield 0, num_queries
        return
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
        if hi <= lo:
            out.append(torch.full((B, H, end - start, topk), NO_KEY, dtype=torch.long, device=q.device))
            continue
        q_pos = torch.arange(q_offset + start, q_offset + end, device=q.device)[:, None]
        k_pos = torch.arange(lo, hi, device=q.device)
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


def select_instead(visible: torch.Tensor, topk: int, how: str, stream: torch.Generator | None = None) -> torch.Tensor:
    """K of the visible keys chosen without looking at q . k: ``visible`` ``[B,H,Tq,Kv]`` (every
    visible key, :func:`select_all`) -> idx ``[B,H,Tq,topk]``. ``how``: ``"recent"``, the K
    newest (newest first); ``"random"``, K drawn uniformly without replacement from
    ``stream``. A query with fewer than K visible keys keeps them all, -1 in the rest."""
    if how == "recent":
        rank = visible.to(torch.float32)
    else:
        rank = torch.rand(visible.shape, generator=stream).to(visible.device)
    rank = rank.masked_fill(visible == NO_KEY, float("-inf"))
    kept = min(topk, visible.shape[-1])
    picked = visible.gather(-1, rank.topk(kept, dim=-1).indices)   # -inf ranks picked only past the visible keys
    if kept < topk:
        picked = torch.cat([picked, picked.new_full((*picked.shape[:-1], topk - kept), NO_KEY)], dim=-1)
    return picked


def select_block(q: torch.Tensor, k: torch.Tensor, topk: int, vis: Visibility) -> torch.Tensor:
    """Square-root partitioned Top-K (paper Alg. 2). q ``[B,H,T,D]``, k ``[B,H,T,D]``.

    Keys are cut into blocks of ``ceil(sqrt(T))`` keys (the last one padded). Each query always
    keeps its own block (its most recent keys) and adds the ``ceil(K / block)``
    other visible blocks whose mean key (centroid) scores best, then takes the exact
    Top-K inside those candidates. Under causality a query only ranks blocks that
    lie wholly in its past, so no centroid mixes in a future key. Returns the exact
    Top-K whenever the best keys lie in the chosen blocks.
    """
    part = BlockPartition.of(k, topk, vis.key_valid)
    picks = _pick_blocks(q, part.centroids, part.count > 0, part.size, part.n_pick, vis)   # [B,H,T,n_pick]
    best, pos = _score_picked_blocks(q, part.k_blocks, part.key_ok, picks, topk, vis)     # [B,H,T,n_pick,K]
    return topk_positions(best.flatten(-2), pos.flatten(-2), topk)


@dataclass(frozen=True)
class BlockPartition:
    """The keys of :func:`select_block` cut into ``n_blocks`` blocks of ``size``.

    key_ok ``[B, n_blocks*size]`` (False for padding and invalid keys), k_blocks
    ``[B, H, n_blocks, size, D]`` (zero padded), count ``[B, n_blocks]`` valid keys per
    block, centroids ``[B, H, n_blocks, D]`` (mean valid key), n_pick blocks per query.
    """

    size: int
    n_blocks: int
    n_pick: int
    key_ok: torch.Tensor
    k_blocks: torch.Tensor
    count: torch.Tensor
    centroids: torch.Tensor

    @classmethod
    def of(cls, k: torch.Tensor, topk: int, key_valid: torch.Tensor | None) -> "BlockPartition":
        B, H, T, D = k.shape
        size = max(1, math.ceil(math.sqrt(T)))
        n_blocks = math.ceil(T / size)
        pad = n_blocks * size - T
        key_ok = torch.ones(B, T, dtype=torch.bool, device=k.device) if key_valid is None else key_valid
        key_ok = torch.nn.functional.pad(key_ok, (0, pad), value=False)               # [B, T']
        k_blocks = torch.nn.functional.pad(k, (0, 0, 0, pad)).view(B, H, n_blocks, size, D)
        weight = key_ok.view(B, 1, n_blocks, size, 1).to(k.dtype)
        count = weight.sum(dim=3)                                                      # [B,1,nb,1]
        centroids = (k_blocks * weight).sum(dim=3) / count.clamp(min=1)                # [B,H,nb,D]
        return cls(size, n_blocks, min(n_blocks, math.ceil(topk / size) + 1), key_ok, k_blocks,
                   count[:, 0, :, 0], centroids)


def _pick_blocks(q: torch.Tensor, centroids: torch.Tensor, block_has_keys: torch.Tensor, size: int,
                 n_pick: int, vis: Visibility) -> torch.Tensor:
    """Each query's own block plus the ``n_pick - 1`` visible blocks whose centroid scores
    best. q ``[B,H,T,D]``, centroids ``[B,H,nb,D]``, block_has_keys ``[B,nb]``
    -> block indices ``[B,H,T,n_pick]``, ``-1`` where fewer blocks qualify."""
    B, H, T, _ = q.shape
    n_blocks = centroids.shape[2]
    block_first = torch.arange(n_blocks, device=q.device) * size                      # [nb]
    block_last = block_first + size - 1
    out = []
    for start, end in _query_chunks(T, n_blocks):
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
        scores = q[:, :, start:end] @ centroids.transpose(-1, -2)                     # [B,H,C,nb]
        scores = scores.masked_fill(~(rankable & block_has_keys[:, None, None, :]), float("-inf"))
        scores = scores.masked_fill(torch.arange(n_blocks, device=q.device) == own, float("inf"))
        out.append(topk_positions(scores, torch.arange(n_blocks, device=q.device), n_pick))   # ties to the later block
    return torch.cat(out, dim=2)


def _score_picked_blocks(q: torch.Tensor, k_blocks: torch.Tensor, key_ok: torch.Tensor, picks: torch.Tensor,
                         topk: int, vis: Visibility) -> tuple[torch.Tensor, torch.Tensor]:
    """Exact Top-K of each query inside each of its picked blocks.

    q ``[B,H,T,D]``, k_blocks ``[B,H,nb,size,D]``, key_ok ``[B,nb*size]``, picks
    ``[B,H,T,n_pick]`` -> scores and key positions ``[B,H,T,n_pick,topk]``.

    The (query, block) pairs are grouped by block and each group is scored with one
    matrix product against that block's keys, in a batch of groups of ``size`` queries:
    every block's keys are read once per group instead of once per query.
    """
    B, H, T, D = q.shape
    n_blocks, size = k_blocks.shape[2], k_blocks.shape[3]
    dev = q.device
    best = torch.full((*picks.shape, topk), float("-inf"), dtype=q.dtype, device=dev)
    pos = torch.full((*picks.shape, topk), NO_KEY, dtype=torch.long, device=dev)
    best_rows, pos_rows = best.view(-1, topk), pos.view(-1, topk)

    # One entry per valid (query, picked block); a group is one block of one (batch, head).
    entry = (picks >= 0).flatten().nonzero()[:, 0]                                    # rows of best_rows
    query_row = entry // picks.shape[-1]                                              # rows of q [B*H*T, D]
    group = (query_row // T) * n_blocks + picks.flatten()[entry]
    group, order = group.sort(stable=True)
    entry, query_row = entry[order], query_row[order]
    counts = torch.bincount(group, minlength=B * H * n_blocks)
    rank = torch.arange(len(group), device=dev) - (counts.cumsum(0) - counts)[group]
    pieces = (counts + size - 1) // size                                              # per group
    piece = (pieces.cumsum(0) - pieces)[group] + rank // size                        # per entry, sorted
    slot = rank % size
    piece_group = torch.repeat_interleave(torch.arange(len(counts), device=dev), pieces)

    q_rows, key_rows = q.reshape(-1, D), k_blocks.reshape(-1, size, D)
    key_ok_blocks = key_ok.view(B, n_blocks, size)
    in_block = torch.arange(size, device=dev)
    per_chunk = max(1, max(CHUNK_ELEMENTS, PIECE_SCORES_PER_QUERY * B * H * T) // (size * size))
    firsts = range(0, len(piece_group), per_chunk)
    bounds = torch.searchsorted(piece, torch.tensor([*firsts, len(piece_group)], device=dev)).tolist()
    for first, e0, e1 in zip(firsts, bounds, bounds[1:]):
        here = piece_group[first:first + per_chunk]                                   # [S'] groups
        b, blk = here // (H * n_blocks), here % n_blocks
        p, s = piece[e0:e1] - first, slot[e0:e1]                                      # entry -> (piece, slot)
        queries = q.new_zeros(len(here), size, D)
        queries[p, s] = q_rows[query_row[e0:e1]]
        q_pos = torch.zeros(len(here), size, dtype=torch.long, device=dev)
        q_pos[p, s] = query_row[e0:e1] % T
        k_pos = blk[:, None] * size + in_block                                        # [S', size]
        scores = queries @ key_rows[here].transpose(1, 2)                              # [S', size, size]
        ok = vis.allowed(q_pos[:, :, None], k_pos[:, None, :]) & key_ok_blocks[b, blk][:, None, :]
        scores = scores.masked_fill_(~ok, float("-inf"))[p, s]                       # [E', size]
        val, col = _topk(scores, in_block, topk)                                      # col: offset in block
        best_rows[entry[e0:e1]] = val
        pos_rows[entry[e0:e1]] = torch.where(col == NO_KEY, NO_KEY, blk[p][:, None] * size + col)
    return best, pos
