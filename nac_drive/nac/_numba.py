"""numba kernels behind :mod:`~nac_drive.nac.kernels` (imported on first use only).

Shapes are those of :mod:`~nac_drive.nac.selection` and :meth:`~nac_drive.nac.layer.NAC.attend`
with batch and heads flattened where noted. Everything here is plain loops that LLVM
vectorises: the pair stage works on tiles of pairs laid out feature-major
(``[feature, pair]``), so each step is one loop over the pairs of a tile.

libm's exp/tanh/log1p are scalar calls that stop that vectorisation (3-17 ns each
here, and a pair needs ~20 of them), so the pair stage evaluates its own (relative error
< 3e-7 in float32): exp by range reduction ``x = n ln2 + r``, a Taylor polynomial in r
and the power 2^n written into a float's exponent bits (:func:`_exp_split`), which softplus
and 1 - exp(-y) are built on; tanh (16 of a pair's ~20) and sigmoid by one rational function
(:func:`_tanh_into`), one pass and no exp.
"""

from __future__ import annotations

import math

import numpy as np
from numba import njit

_JIT = dict(nogil=True, cache=True, error_model="numpy",
            # No 'nnan'/'ninf': -inf and empty slots are meaningful here.
            fastmath={"contract", "reassoc", "arcp", "nsz"})

NO_KEY = -1
TILE_PAIRS = 256         # (query, key) pairs per tile of the pair stage

f32 = np.float32
# Loop indices that are offsets are unsigned: numba wraps negative signed indices, and
# that check stops LLVM from vectorising a loop (5x slower measured here).
U = np.uint64
_LOG2E = f32(1.0 / math.log(2.0))
_LN2_HI = f32(0.693359375)                     # ln 2 split so that n * _LN2_HI is exact
_LN2_LO = f32(math.log(2.0) - 0.693359375)
# Taylor coefficients 1/i! (of e^r, and of 1 - e^-y) and 1/(2i+1) (of atanh)
_F2, _F3, _F4, _F5, _F6, _F7, _F8, _F9, _F10 = (f32(1.0 / math.factorial(i)) for i in range(2, 11))
_A3, _A5, _A7, _A9, _A11, _A13, _A15, _A17 = (f32(1.0 / i) for i in range(3, 18, 2))


# ------------------------------------------------------------------------ key selection
@njit(**_JIT)
def _visible_range(pos, num_keys, causal, window):
    """Half-open range of key positions query ``pos`` may see (Visibility.allowed)."""
    lo = 0 if window < 0 else max(0, pos - window + 1)
    if causal:
        hi = pos + 1
    elif window < 0:
        hi = num_keys
    else:
        hi = pos + window
    return lo, min(hi, num_keys)


@njit(inline="always", **_JIT)
def _ahead(score, key, other_score, other_key):
    """Ranking of candidates: the higher score, and among equal scores the newer key
    (a car standing still sends identical frames; the newest of them is the one to read)."""
    return score > other_score or (score == other_score and key > other_key)


@njit(inline="always", **_JIT)
def _insert(score, key, n, topk, best, out):
    """Insert (score, key) into the buffer best[:n] / out[:n], kept in :func:`_ahead`
    order; returns the new n (at most topk: a full buffer drops its last entry)."""
    p = n if n < topk else topk - 1
    if n == topk and not _ahead(score, key, best[p], out[p]):
        return n
    while p > 0 and _ahead(score, key, best[p - 1], out[p - 1]):
        best[p] = best[p - 1]
        out[p] = out[p - 1]
        p -= 1
    best[p] = score
    out[p] = key
    return n + 1 if n < topk else n


# Selection compares finite scores only (`empty`, the dtype's lowest finite value, marks
# a key that may not be chosen), so it can use full fast-math.
_SELECT_JIT = dict(_JIT, fastmath=True)
_CHUNK = 16  # scores per chunk when looking for the Top-K
_RANK_MAX = 32  # up to this many scores, the Top-K by ranking every one (measured faster at 16)


@njit(inline="always", **_SELECT_JIT)
def _top_by_rank(scores, keys, n, empty, row):
    """:func:`_top_of` for a few scores: each candidate's rank is the number of candidates
    :func:`_ahead` of it (n^2 comparisons without a branch, against insertion's
    mispredicted ones); those ranked below K take their slot."""
    topk = row.shape[0]
    found = 0
    for c in range(n):
        s, key = scores[c], keys[c]
        if s > empty:
            rank = 0
            for other in range(U(n)):
                rank += (scores[other] > s) | ((scores[other] == s) & (keys[other] > key))
            if rank < topk:
                row[rank] = key
            found += 1
    for p in range(min(found, topk), topk):
        row[p] = NO_KEY


@njit(**_SELECT_JIT)
def _top_of(scores, keys, n, empty, best, row, chunk_max):
    """row[:K] = the keys of the K largest of scores[:n] (those above ``empty``), best
    first; NO_KEY in the slots left over. ``best``, ``row`` K-slot buffers, ``chunk_max``
    an n-slot scratch buffer.

    Most scores cannot make the Top-K: the K-th largest chunk maximum is a lower bound
    of the K-th largest score (K distinct scores reach it), so only the chunks whose
    maximum reaches it are searched score by score.
    """
    topk = row.shape[0]
    if n <= _RANK_MAX:
        _top_by_rank(scores, keys, n, empty, row)
        return
    size = U(max(1, min(_CHUNK, n // topk)))
    n = U(n)
    n_chunks = (n + size - U(1)) // size
    threshold = empty
    if n > topk:
        for k in range(n_chunks):
            top = scores[k * size]
            for c in range(k * size + U(1), min(n, k * size + size)):
                top = max(top, scores[c])
            chunk_max[k] = top
        found = 0
        for k in range(n_chunks):
            found = _insert(chunk_max[k], k, found, topk, best, row)
        threshold = best[topk - 1]
    found = 0
    for k in range(n_chunks):
        if n <= topk or chunk_max[k] >= threshold:
            for c in range(k * size, min(n, k * size + size)):
                s = scores[c]
                if s >= threshold and s > empty:
                    found = _insert(s, keys[c], found, topk, best, row)
    for p in range(found, topk):
        row[p] = NO_KEY


# Block selection ranks float32 scores packed with their keys into int64s: LLVM vectorises a max
# reduction over ints, and leaves one over floats scalar here (its min/max pattern needs flags numba
# does not set on the select).
NO_CANDIDATE = np.iinfo(np.int64).min   # a packed candidate that may not be chosen
NONE_32 = np.iinfo(np.int32).min       # an ordered score (:func:`_ordered`) that may not be chosen
_KEY_BITS = 32
_ROWS_AT_ONCE = 32   # queries whose packed Top-K passes run interleaved (8 or more measured alike)


@njit(inline="always", **_SELECT_JIT)
def _ordered(score_bits):
    """A float32 score's bits (int32) -> an int32 that orders as the scores do: the sign-magnitude
    bits as two's complement (-0.0 as 0.0, so equal scores stay equal). Never NONE_32."""
    magnitude = score_bits & 0x7FFFFFFF
    return magnitude if score_bits >= 0 else -magnitude


@njit(inline="always", **_SELECT_JIT)
def _pack(score_bits, key):
    """A float32 score (its bits, int32) and its key (< 2^32) -> an int64 that orders as
    :func:`_ahead` ranks them: the :func:`_ordered` score above the key (equal scores, so the
    newer key first)."""
    return _pack_ordered(_ordered(score_bits), key)


@njit(inline="always", **_SELECT_JIT)
def _pack_ordered(ordered, key):
    """:func:`_pack` of a score already :func:`_ordered`."""
    return (np.int64(ordered) << _KEY_BITS) | np.int64(key)


@njit(**_SELECT_JIT)
def _top_of_packed(packed, n, out):
    """out[r] = the keys of the K largest of packed[r, :n] (:func:`_pack`, NO_CANDIDATE for none),
    best first, NO_KEY in the slots left over: packed ``[R, >= n]``, out ``[R, K]``. (A row's length
    is passed, not sliced: a strided view is compiled for any layout, and its loop then runs scalar.)

    Pass p takes each row's largest value below the one pass p - 1 took (packed values are
    distinct): a branch-free max reduction per row, and the rows of a pass independent, so that
    the CPU overlaps their latencies. out holds the packed values until the last pass."""
    R = packed.shape[0]
    for p in range(out.shape[1]):
        for r in range(R):
            taken = out[r, p - 1] if p > 0 else np.iinfo(np.int64).max
            top = NO_CANDIDATE
            for c in range(U(n)):
                v = packed[r, c]
                top = max(top, v if v < taken else NO_CANDIDATE)
            out[r, p] = top
    for r in range(R):
        for p in range(out.shape[1]):
            out[r, p] = out[r, p] & ((1 << _KEY_BITS) - 1) if out[r, p] != NO_CANDIDATE else NO_KEY


@njit(inline="always", **_SELECT_JIT)
def _rankable(blk, own, size, lo, hi, has_keys):
    """Whether a query of block ``own`` may rank block ``blk``: another block, holding valid keys,
    that overlaps the query's visible interval [lo, hi]."""
    return (blk != own) & has_keys & (blk * size + size - 1 >= lo) & (blk * size <= hi)


# Exact selection views a float32 query's n scores as rows of this many columns: a column's
# maximum is one vectorised max per row, and the K-th largest of them bounds the K-th largest score.
_COLUMNS = 64


@njit(**_SELECT_JIT)
def topk_exact_rows(q, kT, key_valid, heads, causal, window, q_offset, empty, out):
    """Exact Top-K by q . k over each query's visible keys.

    q ``[BH, Tq, D]``, kT ``[BH, D, Tk]`` (keys transposed), key_valid ``[B, Tk]`` bool,
    window < 0 for none -> out ``[BH, Tq, K]`` key positions, best first, ``NO_KEY`` in
    empty slots. Queries go in runs of ``_ROWS_AT_ONCE``: a float32 run in which some query
    sees more than ``_RANK_MAX`` keys is ranked by :func:`_rank_run_ordered`, any other query
    by :func:`_top_of` (float64 scores do not fit beside a key in 64 bits; a few scores are
    ranked all against all).
    """
    BH, Tq, _ = q.shape
    Tk = kT.shape[2]
    topk = out.shape[2]
    run = min(_ROWS_AT_ONCE, Tq)
    padded = (_most_visible(0, Tq, Tk, causal, window, q_offset) + _COLUMNS - 1) // _COLUMNS * _COLUMNS
    scores = np.empty((run, padded), q.dtype)
    keys, chunk_max = np.empty(padded, np.int64), np.empty(padded, q.dtype)
    best, row = np.empty(topk, q.dtype), np.empty(topk, np.int64)
    col_max, threshold = np.empty((run, _COLUMNS), np.int32), np.empty(run, np.int32)
    packed, found = np.empty((run, padded), np.int64), np.empty(run, np.int64)
    first_key, n_rows = np.empty(run, np.uint64), np.empty(run, np.uint64)
    floor = _ordered(np.array([empty], np.float32).view(np.int32)[0])   # `empty` as an ordered float32
    for bh in range(BH):
        b = bh // heads
        for i0 in range(0, Tq, run):
            rows = min(run, Tq - i0)
            if q.itemsize == 4 and _most_visible(i0, rows, Tk, causal, window, q_offset) > _RANK_MAX:
                _rank_run_ordered(q, kT, key_valid[b], bh, i0, rows, causal, window, q_offset, floor, scores, col_max,
                                  threshold, packed, found, first_key, n_rows, out)
                continue
            for i in range(i0, i0 + rows):
                lo, n = _scores_into(q, kT, bh, i, causal, window, q_offset, scores[0])
                for c in range(n):
                    keys[c] = lo + c
                    if not key_valid[b, lo + c]:
                        scores[0, c] = empty
                _top_of(scores[0], keys, n, empty, best, row, chunk_max)
                out[bh, i] = row


@njit(inline="always", **_SELECT_JIT)
def _scores_into(q, kT, bh, i, causal, window, q_offset, scores):
    """scores[:n] = q[bh, i] . k over the query's visible keys lo .. lo + n - 1 -> (lo, n)."""
    lo, hi = _visible_range(q_offset + i, kT.shape[2], causal, window)
    n, lo = U(max(hi - lo, 0)), U(lo)
    scores[:n] = 0.0
    for d in range(q.shape[2]):
        qd = q[bh, i, d]
        for c in range(n):
            scores[c] += qd * kT[bh, d, lo + c]
    return lo, n


@njit(**_SELECT_JIT)
def _rank_run_ordered(q, kT, key_valid, bh, i0, rows, causal, window, q_offset, floor, scores, col_max, threshold,
                      packed, found, first_key, n_rows, out):
    """out[bh, i0:i0 + rows] for float32 scores (:func:`topk_exact_rows`; key_valid ``[Tk]``; a
    score whose :func:`_ordered` value is not above ``floor`` may not be chosen; the others its
    scratch buffers).

    Each query's scores become :func:`_ordered` integers (NONE_32 where the key may not be
    chosen), viewed as rows of ``_COLUMNS``. The K-th largest column maximum is a lower bound
    of the K-th largest score (K columns reach it), so only the scores that reach it, in the
    columns that reach it, are packed with their keys and ranked (:func:`_top_of_packed`).
    """
    width = U(_COLUMNS)
    ordered = scores.view(np.int32)
    for r in range(rows):
        lo, n = _scores_into(q, kT, bh, i0 + r, causal, window, q_offset, scores[r])
        line = ordered[r]
        for c in range(n):
            v = _ordered(line[c])
            line[c] = v if key_valid[lo + c] and v > floor else NONE_32
        first_key[r], n_rows[r] = lo, (n + width - U(1)) // width
        line[n:n_rows[r] * width] = NONE_32
        col_max[r] = NONE_32
        for row in range(n_rows[r]):
            for j in range(width):
                col_max[r, j] = max(col_max[r, j], line[row * width + j])
    _kth_largest(col_max[:rows], out.shape[2], threshold[:rows])
    longest = 0
    for r in range(rows):
        bound = max(threshold[r], NONE_32 + 1)
        m = 0
        for j in range(width):
            if col_max[r, j] >= bound:
                for row in range(n_rows[r]):
                    c = row * width + j
                    v = ordered[r, c]
                    packed[r, m] = _pack_ordered(v, first_key[r] + c)
                    m += v >= bound   # branch-free: the slot is overwritten unless it qualifies
        found[r] = m
        longest = max(longest, m)
    for r in range(rows):
        packed[r, found[r]:longest] = NO_CANDIDATE
    _top_of_packed(packed[:rows], longest, out[bh, i0:i0 + rows])


@njit(inline="always", **_SELECT_JIT)
def _most_visible(i0, rows, num_keys, causal, window, q_offset):
    """The most keys any of the queries i0 .. i0 + rows - 1 may see."""
    most = 0
    for i in range(i0, i0 + rows):
        lo, hi = _visible_range(q_offset + i, num_keys, causal, window)
        most = max(most, hi - lo)
    return most


@njit(inline="always", **_SELECT_JIT)
def _kth_largest(values, k, out):
    """out[r] = the k-th largest of values[r] counting repeats (int32, NONE_32 for none, and where
    fewer than k qualify). Pass p takes each row's largest value below the one pass p - 1 took,
    the rows interleaved so that the CPU overlaps their latencies (as :func:`_top_of_packed`)."""
    R, n = values.shape
    counted = np.zeros(R, np.int64)
    out[:] = np.iinfo(np.int32).max
    for _ in range(k):
        for r in range(R):
            if counted[r] >= k:
                continue
            taken, top, repeats = out[r], NONE_32, 0
            for j in range(U(n)):
                v = values[r, j]
                top = max(top, v if v < taken else NONE_32)
            for j in range(U(n)):
                repeats += values[r, j] == top
            out[r] = top
            counted[r] = k if top == NONE_32 else counted[r] + repeats


@njit(**_SELECT_JIT)
def topk_block_rows(q, kT, key_ok, count, block_scores, heads, causal, window, size, n_pick, empty, out):
    """Square-root partitioned Top-K (paper Alg. 2), as :func:`~nac_drive.nac.selection.select_block`.

    q ``[BH, T, D]``; the keys cut into blocks of ``size``: kT ``[BH, D, n_blocks*size]``
    (transposed, zero padded), key_ok ``[B, n_blocks*size]``, count ``[B, n_blocks]``
    valid keys per block, block_scores ``[BH, T, n_blocks]`` (q . centroid) -> out
    ``[BH, T, K]``. Each query keeps its own block plus the ``n_pick - 1`` rankable
    blocks that score best, then takes the exact Top-K of its visible, valid keys in them.
    float32 scores are ranked packed (:func:`_top_of_packed`, a run of queries at once),
    float64 ones, which do not fit beside a key in 64 bits, by :func:`_insert` and :func:`_top_of`.
    """
    BH, T, D = q.shape
    topk = out.shape[2]
    n_blocks = count.shape[1]
    n_cand = n_pick * size
    packs = q.itemsize == 4
    block_bits, block_packed = block_scores.view(np.int32), np.empty((1, n_blocks), np.int64)
    others, other_scores = np.empty((1, n_pick - 1), np.int64), np.empty(max(n_pick - 1, 1), q.dtype)
    cand, cand_keys = np.empty(n_cand, q.dtype), np.empty(n_cand, np.int64)
    cand_bits, packed = cand.view(np.int32), np.empty((_ROWS_AT_ONCE, n_cand), np.int64)
    chunk_max, best, row = np.empty(n_cand, q.dtype), np.empty(topk, q.dtype), np.empty(topk, np.int64)
    size_u = U(size)
    for bh in range(BH):
        b = bh // heads
        for i0 in range(0, T, _ROWS_AT_ONCE):
            rows = min(_ROWS_AT_ONCE, T - i0)
            for i in range(i0, i0 + rows):
                own = i // size
                # rankable blocks overlap the visible interval [lo, hi]; under causality
                # they lie wholly before the query's own block
                lo = 0 if window < 0 else i - window + 1
                if causal:
                    hi = own * size - 1
                elif window < 0:
                    hi = T - 1
                else:
                    hi = i + window - 1
                n_others = 0
                if packs:
                    for blk in range(n_blocks):
                        ok = _rankable(blk, own, size, lo, hi, count[b, blk] > 0)
                        block_packed[0, blk] = _pack(block_bits[bh, i, blk], blk) if ok else NO_CANDIDATE
                    _top_of_packed(block_packed, n_blocks, others)
                    while n_others < n_pick - 1 and others[0, n_others] != NO_KEY:
                        n_others += 1
                elif n_pick > 1:
                    for blk in range(n_blocks):
                        if _rankable(blk, own, size, lo, hi, count[b, blk] > 0):
                            n_others = _insert(block_scores[bh, i, blk], blk, n_others, n_pick - 1, other_scores,
                                               others[0])
                lo_key, hi_key = _visible_range(i, T, causal, window)
                lo_key, hi_key = U(lo_key), U(hi_key)
                n = U(0)
                for p in range(1 + n_others):
                    first = U((own if p == 0 else others[0, p - 1]) * size)
                    cand[n:n + size_u] = 0.0
                    for d in range(D):
                        qd = q[bh, i, d]
                        for c in range(size_u):
                            cand[n + c] += qd * kT[bh, d, first + c]
                    for c in range(size_u):
                        j = first + c
                        cand_keys[n + c] = j
                        ok = key_ok[b, j] and j >= lo_key and j < hi_key
                        cand[n + c] = cand[n + c] if ok else empty
                    n += size_u
                if packs:
                    for c in range(n):
                        packed[i - i0, c] = _pack(cand_bits[c], cand_keys[c]) if cand[c] > empty else NO_CANDIDATE
                    packed[i - i0, n:] = NO_CANDIDATE
                else:
                    _top_of(cand, cand_keys, n, empty, best, row, chunk_max)
                    out[bh, i] = row
            if packs:
                _top_of_packed(packed[:rows], n_cand, out[bh, i0:i0 + rows])


# --------------------------------------------------------------------------- pair math
@njit(inline="always", **_JIT)
def _exp_split(v):
    """exp(v) = e * 2^m -> (e, 2^m as float32 bits): a loop that computes these vectorises, and
    so does a second one that multiplies them (the bits read through a float view)."""
    v = min(max(v, f32(-87.0)), f32(88.0))
    m = np.int32(v * _LOG2E + f32(128.5)) - 128            # round(v / ln2), as floor(. + 0.5)
    r = (v - f32(m) * _LN2_HI) - f32(m) * _LN2_LO           # |r| <= ln2 / 2
    e = ((((((_F7 * r + _F6) * r + _F5) * r + _F4) * r + _F3) * r + _F2) * r + f32(1.0)) * r + f32(1.0)
    return e, (m + 127) << 23


@njit(inline="always", **_JIT)
def _grown(y, decayed):
    """1 - exp(-y) for y >= 0, given decayed = exp(-y): accurate relative to itself near 0 (a
    Taylor series below 0.5, where 1 - decayed would cancel)."""
    # sum_{i=1..10} (-1)^(i+1) y^i / i!  (the first omitted term is < 3e-10 at y = 0.5)
    series = f32(1.0) - y * (_F2 - y * (_F3 - y * (_F4 - y * (_F5 - y * (_F6 - y * (_F7 - y * (
        _F8 - y * (_F9 - y * _F10))))))))
    return y * series if y < f32(0.5) else f32(1.0) - decayed


# The exp-based functions below are two loops over the pairs, the first making exp's parts (_exp_split),
# the second the rest; ``bits`` is int32 scratch, ``bits_as_float`` its float32 view.
@njit(inline="always", **_JIT)
def _exp_into(x, out, n, bits, bits_as_float):
    """out[:n] = exp(x[:n]) (x may be out)."""
    for p in range(n):
        out[p], bits[p] = _exp_split(x[p])
    for p in range(n):
        out[p] *= bits_as_float[p]


@njit(inline="always", **_JIT)
def _one_minus_exp_neg_into(y, out, n, tmp, bits, bits_as_float):
    """out[:n] = 1 - exp(-y) = -expm1(-y) for y >= 0 (:func:`_grown`; y may be out); leaves exp(-y) in tmp."""
    for p in range(n):
        tmp[p], bits[p] = _exp_split(-y[p])
    for p in range(n):
        decayed = tmp[p] * bits_as_float[p]
        tmp[p] = decayed
        out[p] = _grown(y[p], decayed)


# tanh(x) = x P(x^2) / Q(x^2) for |x| <= _TANH_CLAMP, P of degree 6 and Q of degree 3: fitted to tanh's
# relative error on [0, 9] (linearised least squares, then Lawson's reweighting towards minimax: 9e-9
# in float64; float32 evaluation stays under 3e-7 on [-90, 90]). Past 9, tanh is 1 within 3e-8.
_TANH_CLAMP = f32(9.0)
_TP1, _TP2, _TP3, _TP4, _TP5, _TP6 = (f32(c) for c in (
    0.1308412253856659, 0.003104095347225666, 1.1156203981954604e-05, -2.0235964015569152e-08,
    5.284930826299217e-11, -8.511472234483397e-14))
_TQ1, _TQ2, _TQ3 = (f32(c) for c in (0.4641745090484619, 0.024495694786310196, 0.00025463724159635603))


@njit(inline="always", **_JIT)
def _tanh(x):
    """tanh(x) by the rational function above: relative accuracy kept near 0, where the backbone's
    pre-activations often are; never past +-1."""
    v = min(max(x, -_TANH_CLAMP), _TANH_CLAMP)
    v2 = v * v
    num = (((((_TP6 * v2 + _TP5) * v2 + _TP4) * v2 + _TP3) * v2 + _TP2) * v2 + _TP1) * v2 + f32(1.0)
    den = ((_TQ3 * v2 + _TQ2) * v2 + _TQ1) * v2 + f32(1.0)
    return min(max(v * num / den, f32(-1.0)), f32(1.0))


@njit(inline="always", **_JIT)
def _tanh_into(x, out, n):
    """out[:n] = tanh(x[:n]) (:func:`_tanh`; x may be out), one loop."""
    for p in range(n):
        out[p] = _tanh(x[p])


@njit(inline="always", **_JIT)
def _sigmoid_into(x, out, n):
    """out[:n] = 1 / (1 + exp(-x[:n])) = (1 + tanh(x / 2)) / 2 (x may be out), one loop: absolute
    error < 3e-7 (its relative accuracy goes where it nears 0: below -18 it is 0)."""
    for p in range(n):
        out[p] = f32(0.5) + f32(0.5) * _tanh(f32(0.5) * x[p])


@njit(inline="always", **_JIT)
def _softplus_into(x, out, n, tmp, bits, bits_as_float):
    """out[:n] = log(1 + exp(x)) = max(x, 0) + log1p(z), z = exp(-|x|) in (0, 1];
    log1p(z) = 2 atanh(s), s = z / (2 + z) <= 1/3, by its odd series to s^17."""
    for p in range(n):
        tmp[p], bits[p] = _exp_split(-abs(x[p]))
    for p in range(n):
        z = tmp[p] * bits_as_float[p]
        s = z / (f32(2.0) + z)
        s2 = s * s
        series = (((((((_A17 * s2 + _A15) * s2 + _A13) * s2 + _A11) * s2 + _A9) * s2 + _A7) * s2 + _A5) * s2
                  + _A3) * s2 + f32(1.0)
        out[p] = max(x[p], f32(0.0)) + f32(2.0) * s * series


# --------------------------------------------------------------------------- pair stage
MODE_EXACT, MODE_EULER, MODE_STEADY = 0, 1, 2
TIME_ONE, TIME_QUERY, TIME_ELAPSED = 0, 1, 2


@njit(inline="always", **_JIT)
def _record_pairs(trace_out, b, h, i, base, keys, inter, cmd, motor, phi, tau, t_interp, logit, e, total):
    """Write query i's K pairs (tile columns base..base+K-1) into the trace arrays: each
    stage's value, NaN in an empty slot, whose attention weight is 0."""
    tr_inter, tr_cmd, tr_motor, tr_phi, tr_tau, tr_t, tr_logit, tr_w = trace_out
    nan = f32(np.nan)
    for kk in range(tr_w.shape[3]):
        p = base + kk
        filled = keys[p] != NO_KEY
        for u in range(inter.shape[0]):
            tr_inter[b, h, i, kk, u] = inter[u, p] if filled else nan
        for c in range(cmd.shape[0]):
            tr_cmd[b, h, i, kk, c] = cmd[c, p] if filled else nan
        for m in range(motor.shape[0]):
            tr_motor[b, h, i, kk, m] = motor[m, p] if filled else nan
        tr_phi[b, h, i, kk] = phi[p] if filled else nan
        tr_tau[b, h, i, kk] = tau[p] if filled else nan
        tr_t[b, h, i, kk] = t_interp[p] if filled else nan
        tr_logit[b, h, i, kk] = logit[p] if filled else nan
        tr_w[b, h, i, kk] = e[p] / total if filled else f32(0.0)


@njit(**_JIT)
def attend(q_side_t, key_side_t, key_feats, idx, q_times, time_kind, cmd_w, cmd_b, mot_w, mot_b, phi_tau_w,
           phi_tau_b, mode, euler_steps, tau_eps, time_weighted, out, worst_dt_tau, want_trace, trace_out):
    """The NAC pair stage: backbone, phi/tau heads, time vector, logits, softmax, values.

    q_side_t ``[B, H, P, Tq]`` (P = n_inter + 2: W_q q + b, then the time affine's query
    part, feature-major), key_side_t ``[B, H, P + 1, Tk]`` (the key side and timestamp,
    feature-major), key_feats ``[B, H, Tk, >= P + 1 + depth]`` (the same rows, then the
    value), idx ``[B, H, Tq, K]`` (NO_KEY: empty), q_times ``[B, Tq]``; weights as in
    ``packing.PackedWeights`` (cmd_w ``[H, n_inter, n_cmd]``, mot_w ``[H, n_cmd, n_motor]``, phi_tau_w
    ``[H, n_motor, 2]``: the phi and tau read-outs) -> out ``[B, H, Tq, depth]``, float32;
    mode euler also writes the largest dt * tau of a selected pair to ``worst_dt_tau[0]``.
    With ``want_trace``, ``trace_out`` = the arrays inter, command, motor ``[B, H, Tq, K, n]``
    and phi, tau, t_interp, logits, weights ``[B, H, Tq, K]`` receive every stage
    (:func:`_record_pairs`); without, it may hold empty arrays.
    """
    B, H, P, Tq = q_side_t.shape
    K = idx.shape[3]
    depth = out.shape[3]
    n_inter, n_cmd, n_motor = cmd_w.shape[1], cmd_w.shape[2], mot_w.shape[2]
    queries_per_tile = max(1, TILE_PAIRS // K)
    tile = queries_per_tile * K
    pre = np.empty((P, tile), np.float32)          # pair pre-activations, feature-major
    inter = np.empty((n_inter, tile), np.float32)
    cmd = np.empty((n_cmd, tile), np.float32)
    motor = np.empty((n_motor, tile), np.float32)
    acc = np.empty(tile, np.float32)
    t_in = np.empty(tile, np.float32)
    phi = np.empty(tile, np.float32)
    tau = np.empty(tile, np.float32)
    t_interp = np.empty(tile, np.float32)
    logit = np.empty(tile, np.float32)
    tmp = np.empty(tile, np.float32)
    bits = np.empty(tile, np.int32)
    bits_as_float = bits.view(np.float32)
    keys = np.empty(tile, np.int64)
    rows = np.empty(tile, np.uint64)
    safe = np.empty(tile, np.uint64)             # keys[p], or 0 for an empty slot
    for b in range(B):
        for h in range(H):
            qs_t, kf_t, kf, ix, ob = q_side_t[b, h], key_side_t[b, h], key_feats[b, h], idx[b, h], out[b, h]
            for i0 in range(0, Tq, queries_per_tile):
                nq = min(queries_per_tile, Tq - i0)
                n = nq * K
                # gather: pre = query side + key side of every selected pair
                for qi in range(nq):
                    for kk in range(K):
                        rows[qi * K + kk] = i0 + qi
                        keys[qi * K + kk] = ix[i0 + qi, kk]
                        safe[qi * K + kk] = max(ix[i0 + qi, kk], 0)
                for u in range(P):
                    for p in range(n):
                        pre[u, p] = qs_t[u, rows[p]] + kf_t[u, safe[p]]
                for p in range(n):
                    if time_kind == TIME_ELAPSED:
                        t_in[p] = q_times[b, rows[p]] - kf_t[P, safe[p]]
                    elif time_kind == TIME_QUERY:
                        t_in[p] = q_times[b, rows[p]]
                    else:
                        t_in[p] = 1.0
                # backbone (eq. 14): inter -> command -> motor, each tanh
                for u in range(n_inter):
                    _tanh_into(pre[u], inter[u], n)
                for c in range(n_cmd):
                    acc[:n] = cmd_b[h, c]
                    for u in range(n_inter):
                        w = cmd_w[h, u, c]
                        if w != 0.0:  # a missing synapse of the wiring
                            for p in range(n):
                                acc[p] += w * inter[u, p]
                    _tanh_into(acc, cmd[c], n)
                for m in range(n_motor):
                    acc[:n] = mot_b[h, m]
                    for c in range(n_cmd):
                        w = mot_w[h, c, m]
                        if w != 0.0:
                            for p in range(n):
                                acc[p] += w * cmd[c, p]
                    _tanh_into(acc, motor[m], n)
                # heads (eqs. 15, 16): phi = sigmoid(.), tau = softplus(.) + eps
                for head in range(2):
                    acc[:n] = phi_tau_b[h, head]
                    for m in range(n_motor):
                        w = phi_tau_w[h, m, head]
                        for p in range(n):
                            acc[p] += w * motor[m, p]
                    if head == 0:
                        _sigmoid_into(acc, phi, n)
                    else:
                        _softplus_into(acc, tau, n, tmp, bits, bits_as_float)
                for p in range(n):
                    tau[p] += tau_eps
                    acc[p] = pre[n_inter, p] * t_in[p] + pre[n_inter + 1, p]
                _sigmoid_into(acc, t_interp, n)
                # logits (eqs. 2, 3, 18)
                if mode == MODE_STEADY:
                    for p in range(n):
                        logit[p] = phi[p] / tau[p]
                elif mode == MODE_EXACT:
                    for p in range(n):
                        acc[p] = tau[p] * t_interp[p]
                    _one_minus_exp_neg_into(acc, acc, n, tmp, bits, bits_as_float)
                    for p in range(n):
                        logit[p] = phi[p] / tau[p] * acc[p]
                else:
                    for p in range(n):
                        dt = t_interp[p] / f32(euler_steps)
                        if keys[p] != NO_KEY and dt * tau[p] > worst_dt_tau[0]:
                            worst_dt_tau[0] = dt * tau[p]
                        decay, drive = f32(1.0) - dt * tau[p], dt * phi[p]
                        a = drive
                        for _ in range(euler_steps - 1):
                            a = drive + a * decay
                        logit[p] = a
                # softmax over each query's valid keys (empty: weight 0), then eq. 19
                for qi in range(nq):
                    i = i0 + qi
                    base = qi * K
                    top = f32(-np.inf)
                    for kk in range(K):
                        if keys[base + kk] != NO_KEY:
                            top = max(top, logit[base + kk])
                    for kk in range(K):
                        tmp[base + kk] = logit[base + kk] - top if keys[base + kk] != NO_KEY else f32(-87.0)
                _exp_into(tmp, acc, n, bits, bits_as_float)
                for qi in range(nq):
                    base = qi * K
                    total = f32(0.0)
                    for kk in range(K):
                        if keys[base + kk] != NO_KEY:
                            total += acc[base + kk]
                    i = i0 + qi
                    if want_trace:
                        _record_pairs(trace_out, b, h, i, base, keys, inter, cmd, motor, phi, tau, t_interp, logit,
                                      acc, total)
                    for d in range(depth):
                        ob[i, d] = 0.0
                    if total != 0:  # 0: no valid key (weights 0); NaN logits give NaN, as the eager code does
                        for kk in range(K):
                            p = base + kk
                            j = keys[p]
                            if j != NO_KEY:
                                coef = acc[p] / total
                                if time_weighted:
                                    coef *= t_interp[p]
                                for d in range(U(depth)):
                                    ob[i, d] += coef * kf[j, U(P + 1) + d]


@njit(inline="always", **_JIT)
def _grown_and_decayed(y, grown, decayed, n, bits, bits_as_float, precise):
    """grown[:n] = 1 - exp(-y), decayed[:n] = exp(-y) for y >= 0: from the polynomials above
    in float32, from libm where ``precise`` (float64: gradcheck's precision)."""
    if precise:
        for p in range(n):
            decayed[p] = math.exp(-y[p])
            grown[p] = -math.expm1(-y[p])
    else:
        _one_minus_exp_neg_into(y, grown, n, decayed, bits, bits_as_float)   # leaves exp(-y) in decayed


@njit(inline="always", **_JIT)
def _tanh_layer_backward(w, d_next, a, d_a, d_w, n, acc, one):
    """One wired layer of eq. 14 backwards, over a tile's n pairs: ``d_next`` ``[n_out, tile]``,
    the gradient of the next layer's pre-activations ``a @ w + b``, with ``w`` ``[n_in, n_out]`` and
    ``a`` ``[n_in, tile]`` = tanh(this layer's pre-activations) -> ``d_a`` ``[n_in, tile]``, the
    gradient of those pre-activations (tanh' = 1 - tanh^2); adds ``a d_next^T`` into ``d_w``.
    ``acc``: a tile of scratch."""
    for u in range(a.shape[0]):
        acc[:n] = 0.0
        for c in range(d_next.shape[0]):
            wuc = w[u, c]
            s = 0.0
            for p in range(n):
                acc[p] += wuc * d_next[c, p]
                s += a[u, p] * d_next[c, p]
            d_w[u, c] += s
        for p in range(n):
            d_a[u, p] = acc[p] * (one - a[u, p] * a[u, p])


@njit(**_JIT)
def attend_backward(dout, idx, q_side, rows, q_times, time_kind, inter, cmd, motor, phi, tau, t_interp, weights,
                    cmd_w, mot_w, phi_tau_w, mode, euler_steps, tau_eps, time_weighted, d_q_side, d_rows,
                    d_cmd_w, d_cmd_b, d_mot_w, d_mot_b, d_phi_tau_w, d_phi_tau_b, d_q_times):
    """The gradient of :func:`attend` (eqs. 14-19, paper logits) from its traced stages.

    dout ``[B*H, Tq, depth]``; idx ``[B*H, Tq, K]``; q_side ``[B*H, Tq, P]``; rows ``[B*H, Tk, >= P + 1 +
    depth]`` (key side, timestamp, value); q_times ``[B, Tq]``; the stages inter, cmd, motor ``[B*H, Tq, K,
    n]`` and phi, tau, t_interp, weights ``[B*H, Tq, K]`` as the forward traced them; the pair-stage
    weights as in :func:`attend`. Adds into the ``d_*`` arrays (zeroed by the caller), shaped as their
    inputs. float32 or float64 alike (the transcendentals of float64 come from libm).

    As the forward, it works on tiles of pairs laid out feature-major, so that each step
    is one loop over a tile's pairs; an empty slot enters a tile with harmless stage values
    (the trace holds NaN there) and no gradient."""
    BH, Tq, K = idx.shape
    H, n_inter, n_cmd = cmd_w.shape
    n_motor = mot_w.shape[2]
    depth = dout.shape[2]
    P = n_inter + 2
    precise = dout.itemsize == 8
    one = dout.dtype.type(1.0)
    queries_per_tile = max(1, TILE_PAIRS // K)
    tile = queries_per_tile * K
    keys = np.empty(tile, np.int64)
    query = np.empty(tile, np.int64)
    per_pair = np.empty((15, tile), dout.dtype)
    w, t, ph, ta = per_pair[0], per_pair[1], per_pair[2], per_pair[3]       # the tile's stages
    d_weight, d_t, d_logit, d_phi, d_tau, d_r0, d_r1, d_z = (per_pair[4], per_pair[5], per_pair[6], per_pair[7],
                                                            per_pair[8], per_pair[9], per_pair[10], per_pair[11])
    grown, decayed, acc = per_pair[12], per_pair[13], per_pair[14]
    it, cm, mo = np.empty((n_inter, tile), dout.dtype), np.empty((n_cmd, tile), dout.dtype), \
        np.empty((n_motor, tile), dout.dtype)
    d_it, d_cm, d_mo = np.empty((n_inter, tile), dout.dtype), np.empty((n_cmd, tile), dout.dtype), \
        np.empty((n_motor, tile), dout.dtype)
    # the pairs of one batch-head row, in order: a tile is a contiguous run of them
    pair_keys, pair_weights, pair_t = idx.reshape(BH, Tq * K), weights.reshape(BH, Tq * K), t_interp.reshape(BH, Tq * K)
    pair_phi, pair_tau = phi.reshape(BH, Tq * K), tau.reshape(BH, Tq * K)
    pair_inter, pair_cmd, pair_motor = (inter.reshape(BH, Tq * K, n_inter), cmd.reshape(BH, Tq * K, n_cmd),
                                        motor.reshape(BH, Tq * K, n_motor))
    bits = np.empty(tile, np.int32)
    bits_as_float = bits.view(np.float32)
    for bh in range(BH):
        h, b = bh % H, bh // H
        for i0 in range(0, Tq, queries_per_tile):
            nq = min(queries_per_tile, Tq - i0)
            n = nq * K
            # gather the tile's stages, feature-major; then make its empty slots harmless
            first = i0 * K
            for qi in range(nq):
                query[qi * K:(qi + 1) * K] = i0 + qi
            for p in range(n):
                keys[p] = pair_keys[bh, first + p]
                w[p], t[p] = pair_weights[bh, first + p], pair_t[bh, first + p]
                ph[p], ta[p] = pair_phi[bh, first + p], pair_tau[bh, first + p]
            for u in range(n_inter):
                for p in range(n):
                    it[u, p] = pair_inter[bh, first + p, u]
            for c in range(n_cmd):
                for p in range(n):
                    cm[c, p] = pair_cmd[bh, first + p, c]
            for m in range(n_motor):
                for p in range(n):
                    mo[m, p] = pair_motor[bh, first + p, m]
            for p in range(n):
                if keys[p] == NO_KEY:
                    w[p], t[p], ph[p], ta[p] = 0.0, 0.5, 0.5, one
                    for u in range(n_inter):
                        it[u, p] = 0.0
                    for c in range(n_cmd):
                        cm[c, p] = 0.0
                    for m in range(n_motor):
                        mo[m, p] = 0.0
            # eq. 19: out_i = sum_j w_ij t_ij v_j, then the softmax
            for qi in range(nq):
                i = i0 + qi
                through = 0.0
                for kk in range(K):
                    p = qi * K + kk
                    j = keys[p]
                    if j == NO_KEY:
                        d_weight[p] = d_t[p] = 0.0
                        continue
                    coef = w[p] * t[p] if time_weighted else w[p]
                    d_coef = 0.0
                    for d in range(U(depth)):
                        d_coef += dout[bh, i, d] * rows[bh, j, U(P + 1) + d]
                        d_rows[bh, j, U(P + 1) + d] += coef * dout[bh, i, d]
                    d_weight[p] = d_coef * t[p] if time_weighted else d_coef
                    d_t[p] = d_coef * w[p] if time_weighted else 0.0
                    through += w[p] * d_weight[p]
                for kk in range(K):
                    p = qi * K + kk
                    d_logit[p] = w[p] * (d_weight[p] - through)       # 0 in an empty slot (w = 0)
            # the logit's solver (eqs. 18, 3, 2)
            if mode == MODE_STEADY:
                for p in range(n):
                    d_phi[p] = d_logit[p] / ta[p]
                    d_tau[p] = -d_logit[p] * ph[p] / (ta[p] * ta[p])
            elif mode == MODE_EXACT:
                for p in range(n):
                    acc[p] = ta[p] * t[p]
                _grown_and_decayed(acc, grown, decayed, n, bits, bits_as_float, precise)
                for p in range(n):
                    d_phi[p] = d_logit[p] * grown[p] / ta[p]
                    d_tau[p] = d_logit[p] * ph[p] * (t[p] * decayed[p] / ta[p] - grown[p] / (ta[p] * ta[p]))
                    d_t[p] += d_logit[p] * ph[p] * decayed[p]
            else:   # a <- drive + a decay, N - 1 times from a = drive; d a / d(drive, decay) alongside
                for p in range(n):
                    step = t[p] / euler_steps
                    decay, drive = one - step * ta[p], step * ph[p]
                    a, a_drive, a_decay = drive, one, 0.0 * one
                    for _ in range(euler_steps - 1):
                        a_decay = a + a_decay * decay
                        a_drive = one + a_drive * decay
                        a = drive + a * decay
                    d_drive, d_decay = d_logit[p] * a_drive, d_logit[p] * a_decay
                    d_phi[p], d_tau[p] = d_drive * step, -d_decay * step
                    d_t[p] += (d_drive * ph[p] - d_decay * ta[p]) / euler_steps
            # eqs. 15, 16: phi = sigmoid(r0), tau = softplus(r1) + eps, softplus' = 1 - exp(-softplus)
            for p in range(n):
                acc[p] = ta[p] - tau_eps
            _grown_and_decayed(acc, grown, decayed, n, bits, bits_as_float, precise)
            s0 = s1 = 0.0
            for p in range(n):
                d_r0[p] = d_phi[p] * ph[p] * (one - ph[p])
                d_r1[p] = d_tau[p] * grown[p]
                s0 += d_r0[p]
                s1 += d_r1[p]
            d_phi_tau_b[h, 0] += s0
            d_phi_tau_b[h, 1] += s1
            # the time vector t = sigmoid(a t_in + b), (a, b) the pair's last two pre-activations
            for p in range(n):
                d_z[p] = d_t[p] * t[p] * (one - t[p])
            # eq. 14 backwards: motor, command, inter (tanh' = 1 - tanh^2); each weight's
            # gradient a sum over the tile's pairs
            for m in range(n_motor):
                s0 = s1 = 0.0
                w0, w1 = phi_tau_w[h, m, 0], phi_tau_w[h, m, 1]
                for p in range(n):
                    s0 += mo[m, p] * d_r0[p]
                    s1 += mo[m, p] * d_r1[p]
                    d_mo[m, p] = (w0 * d_r0[p] + w1 * d_r1[p]) * (one - mo[m, p] * mo[m, p])
                d_phi_tau_w[h, m, 0] += s0
                d_phi_tau_w[h, m, 1] += s1
                d_mot_b[h, m] += d_mo[m, :n].sum()
            _tanh_layer_backward(mot_w[h], d_mo, cm, d_cm, d_mot_w[h], n, acc, one)
            for c in range(n_cmd):
                d_cmd_b[h, c] += d_cm[c, :n].sum()
            _tanh_layer_backward(cmd_w[h], d_cm, it, d_it, d_cmd_w[h], n, acc, one)
            # eq. 14's first layer W [q_i; k_j] + b and the time affine (a, b) read both halves of the
            # pair: each gradient goes to the query's row and the key's
            for p in range(n):
                i, j = query[p], keys[p]
                if j == NO_KEY:
                    continue
                for u in range(n_inter):
                    d_q_side[bh, i, u] += d_it[u, p]
                    d_rows[bh, j, u] += d_it[u, p]
                if time_kind == TIME_ELAPSED:
                    t_in = q_times[b, i] - rows[bh, j, P]
                elif time_kind == TIME_QUERY:
                    t_in = q_times[b, i]
                else:
                    t_in = one
                d_q_side[bh, i, n_inter] += d_z[p] * t_in
                d_rows[bh, j, n_inter] += d_z[p] * t_in
                d_q_side[bh, i, n_inter + 1] += d_z[p]
                d_rows[bh, j, n_inter + 1] += d_z[p]
                if time_kind != TIME_ONE:   # t_in reads the query's time (and, elapsed, the key's)
                    slope = q_side[bh, i, n_inter] + rows[bh, j, n_inter]
                    d_q_times[b, i] += d_z[p] * slope
                    if time_kind == TIME_ELAPSED:
                        d_rows[bh, j, P] -= d_z[p] * slope


# --------------------------------------------------------------------------- a streamed step
_LOWEST = f32(np.finfo(np.float32).min)   # the score of a key selection may not choose (kernels._empty_score)


@njit(inline="always", **_JIT)
def _linear_into(w, b, x, out):
    """out = w x + b (F.linear): w ``[n_out, n_in]``, b ``[n_out]``, x ``[n_in]``."""
    for o in range(w.shape[0]):
        acc = f32(0.0)
        for i in range(x.shape[0]):
            acc += w[o, i] * x[i]
        out[o] = acc + b[o]


@njit(inline="always", **_JIT)
def _all_finite(a):
    for v in a.ravel():
        if not np.isfinite(v):
            return False
    return True


@njit(**_JIT)
def stream_step(x, cache, now, time_kind, qkv_w, qkv_b, query_w, query_b, key_w, key_b, cmd_w, cmd_b, mot_w, mot_b,
                phi_tau_w, phi_tau_b, out_w, out_b, steps, select_all, mode, euler_steps, tau_eps, time_weighted, qkv,
                cache_out, idx, out, y, worst_dt_tau, want_trace, trace_out):
    """One step of :func:`~nac_drive.nac.streaming.step` in one call: the gates (eq. 13), the new
    key row pushed into the cache, the Top-K over the cached keys (:func:`topk_exact_rows`, or
    every filled slot with ``select_all``), the pair stage (:func:`attend`) and the output projection.

    x ``[B, input_dim]``, cache ``[B, H, C, width]`` (:class:`~nac_drive.nac.packing.KeyLayout`
    rows, ``steps`` of them consumed so far), now ``[B]`` the step's time (the key's stamp and the
    query's time); the linear maps as F.linear reads them (qkv ``[3*d_model, input_dim]``, the
    query and key halves ``[H*P, d_model]``, out ``[d_model, d_model]``), the pair stage's weights
    as :func:`attend` does -> qkv ``[B, 3*d_model]`` (q, k, v), cache_out ``[B, H, C_out, width]``
    (C_out = C with a window: the oldest row dropped; C + 1 without), idx ``[B, H, 1, K]`` (the
    selected slots), out ``[B, H, 1, depth]`` (the heads), y ``[B, d_model]`` and with
    ``want_trace`` the pair stages in ``trace_out`` (:func:`attend`); mode euler writes the largest
    dt * tau to worst_dt_tau[0]. Returns False, before selecting, when q, the query half or a key
    row holds a NaN or an inf, which the fast-math selection and pair stage may not see (the
    caller takes the eager code).
    """
    B, H, C, width = cache.shape
    C_out, K, depth = cache_out.shape[2], idx.shape[3], out.shape[3]
    D = H * depth
    P = query_w.shape[0] // H
    kept = C_out - 1
    q_half = np.empty(H * P, f32)
    key_half = np.empty(H * P, f32)
    q_side_t = np.empty((B, H, P, 1), f32)            # the query half, feature-major (attend's layout)
    for b in range(B):
        _linear_into(qkv_w, qkv_b, x[b], qkv[b])
        q, k, v = qkv[b, :D], qkv[b, D:2 * D], qkv[b, 2 * D:]
        _linear_into(query_w, query_b, q, q_half)
        _linear_into(key_w, key_b, k, key_half)
        for h in range(H):
            q_side_t[b, h, :, 0] = q_half[h * P:(h + 1) * P]
            cache_out[b, h, :kept] = cache[b, h, C - kept:]
            row = cache_out[b, h, kept]
            row[:P] = key_half[h * P:(h + 1) * P]
            row[P] = now[b]
            row[P + 1:P + 1 + depth] = v[h * depth:(h + 1) * depth]
            row[P + 1 + depth:] = k[h * depth:(h + 1) * depth]
    if not (_all_finite(qkv[:, :D]) and _all_finite(q_side_t) and _all_finite(cache_out)):
        return False
    first = max(C_out - steps - 1, 0)                   # slots before it hold no step yet
    if select_all:
        for c in range(C_out):
            idx[:, :, 0, c] = c if c >= first else NO_KEY
    else:
        q_heads = np.empty((B * H, 1, depth), f32)
        keys_t = np.empty((B * H, depth, C_out), f32)
        key_valid = np.empty((B, C_out), np.bool_)
        for b in range(B):
            for c in range(C_out):
                key_valid[b, c] = c >= first
            for h in range(H):
                q_heads[b * H + h, 0] = qkv[b, h * depth:(h + 1) * depth]
                for d in range(depth):
                    for c in range(C_out):
                        keys_t[b * H + h, d, c] = cache_out[b, h, c, P + 1 + depth + d]
        topk_exact_rows(q_heads, keys_t, key_valid, H, False, -1, 0, _LOWEST, idx.reshape(B * H, 1, K))
    key_side_t = np.empty((B, H, P + 1, C_out), f32)   # the key half and stamp, feature-major
    for b in range(B):
        for h in range(H):
            for u in range(P + 1):
                for c in range(C_out):
                    key_side_t[b, h, u, c] = cache_out[b, h, c, u]
    attend(q_side_t, key_side_t, cache_out, idx, now.reshape(B, 1), time_kind, cmd_w, cmd_b, mot_w, mot_b,
           phi_tau_w, phi_tau_b, mode, euler_steps, tau_eps, time_weighted, out, worst_dt_tau, want_trace, trace_out)
    heads = out.reshape(B, D)                           # concatenated, head by head
    for b in range(B):
        _linear_into(out_w, out_b, heads[b], y[b])
    return True
