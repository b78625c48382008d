"""The one-group hit searches, the caching mask and the hash chain, over
every input of a finite domain.

These properties were CrossHair harnesses; over lists of booleans and small
ints CrossHair only enumerates paths, slower than plain Python (up to 80 s
for one property at four blocks), and stopped at its path budget. Enumerated
here they are exhaustive within larger bounds: every cached/uncached
pattern of up to 7 blocks, block sizes 1-2, alignments of 1-3 blocks.

``per`` is the alignment in blocks: the scheduler block size is the LCM of
the group block sizes, so the alignment is a multiple of the block size.
"""

from __future__ import annotations

from itertools import product
from typing import Any, cast

from kvproofs.bounded import check, expect
from kvproofs.bounded.domains import subsets
from kvproofs.contracts import about
from kvspec import hashing
from kvspec import single_type_kv_cache_manager as stm
from kvspec.config import SlidingWindow
from kvspec.hashing import BlockHash, ExtraKeySource, LoRA

N = 7
"""Longest cached/uncached pattern, in blocks."""


def _patterns(n: int = N) -> list[tuple[bool, ...]]:
    return [p for k in range(n + 1) for p in subsets(k)]


@check
@about(stm.full_attention_hit)
def full_attention_search() -> int:
    """The hit is aligned, cached (the dropped EAGLE block too), the longest
    such, and downward closed: a cached prefix of ``k`` blocks gives a hit of
    at least ``k`` aligned down (``k - 1`` aligned down under EAGLE)."""
    cases = 0
    for present, drop, bs, per in product(_patterns(), (False, True), (1, 2), (1, 2, 3)):
        cases += 1
        case = (present, drop, bs, per)
        hit = stm.full_attention_hit(present, drop, bs, bs * per)
        expect(hit % per == 0, "aligned", case)
        expect(all(present[: hit + (1 if drop and hit > 0 else 0)]), "cached, with the EAGLE block", case)
        longer = hit + per + drop <= len(present) and all(present[: hit + per + drop])
        expect(not longer, "no longer aligned hit", case)
        k = next((i for i, p in enumerate(present) if not p), len(present))
        want = (k - 1) - (k - 1) % per if drop and k > 0 else k - k % per
        expect(hit >= want, "downward closed", case)
    return cases


def _need(window: int, bs: int, drop: bool) -> int:
    return stm.contiguous_blocks_for_hit(window, bs, drop)


def _swa_hit_ending_at(present: tuple[bool, ...], end: int, drop: bool, need: int) -> bool:
    """Whether a sliding-window hit of ``end`` blocks is possible: the ``need``
    blocks (at least one, as in vLLM) before ``end`` (+1 under EAGLE) are cached."""
    last = end + drop
    return last <= len(present) and all(present[max(0, last - max(need, 1)) : last])


@check
@about(stm.sliding_window_hit, stm.contiguous_blocks_for_hit)
def sliding_window_search() -> int:
    """The run is cached, aligned, holds the blocks the window needs (or
    starts at block 0) with the EAGLE block, and no aligned hit ends further
    right (the search is right to left)."""
    cases = 0
    for present, window, drop, bs, per in product(_patterns(6), range(1, 6), (False, True), (1, 2), (1, 2, 3)):
        cases += 1
        case = (present, window, drop, bs, per)
        need = _need(window, bs, drop)
        first, hit = stm.sliding_window_hit(present, need, drop, bs, bs * per)
        expect(0 <= first <= hit <= len(present), "0 <= first <= hit <= len", case)
        expect(hit % per == 0, "aligned", case)
        expect(all(present[first : hit + (1 if drop and hit > 0 else 0)]), "cached, with the EAGLE block", case)
        expect(first == 0 or hit + drop - first >= need, "the window's blocks, or a run from block 0", case)
        ends = range((hit // per + 1) * per, len(present) + 1, per)
        expect(not any(_swa_hit_ending_at(present, e, drop, need) for e in ends), "rightmost", case)
    return cases


@check
@about(stm.mamba_hit)
def mamba_search() -> int:
    """The rightmost cached state whose end is aligned, else ``(0, 0)``."""
    cases = 0
    for present, bs, per in product(_patterns(), (1, 2), (1, 2, 3)):
        cases += 1
        case = (present, bs, per)
        got = stm.mamba_hit(present, bs, bs * per)
        expect(got == (0, 0) or (got[1] == got[0] + 1 and present[got[0]]), "one cached state", case)
        expect(got == (0, 0) or got[1] % per == 0, "aligned", case)
        later = any(present[i] and (i + 1) % per == 0 for i in range(got[1], len(present)))
        expect(not later, "rightmost", case)
    return cases


@check
@about(stm.chunked_local_hit)
def chunked_local_search() -> int:
    """Blocks before the current chunk are skipped; within it, the cached
    prefix up to the first miss."""
    cases = 0
    for bs, chunk_blocks, max_length in product((1, 2), (1, 2, 3), range(15)):
        for present in subsets(max_length // bs):
            cases += 1
            case = (present, max_length, chunk_blocks, bs)
            first, end = stm.chunked_local_hit(present, max_length, chunk_blocks * bs, bs)
            expect(first * bs == max_length // (chunk_blocks * bs) * chunk_blocks * bs, "skips to the chunk", case)
            expect(all(present[first:end]), "cached", case)
            expect(end == len(present) or not present[end], "up to the first miss", case)
    return cases


def _needed(window: int, bs: int, per: int, eagle: bool, upto: int) -> set[int]:
    """Blocks ``< upto`` that some sliding-window hit looks up (all-cached prefixes)."""
    need = _need(window, bs, eagle)
    out: set[int] = set()
    for m in range(1, upto + need + 2):
        first, length = stm.sliding_window_hit((True,) * m, need, eagle, bs, bs * per)
        if length > 0:
            out.update(i for i in range(first, length + eagle) if i < upto)
    return out


@check
@about(stm.reachable_block_mask)
def reachable_mask() -> int:
    """A sliding-window mask marks exactly the blocks some hit at an aligned
    length looks up; None ("cache every block") over-approximates by at most
    block 0 (under EAGLE, when the window needs exactly one alignment unit).
    Window 1 is left out: it needs no contiguous block, yet the search still
    returns the one cached block it stopped at (vLLM 0.25.1 alike)."""
    cases = 0
    for window, bs, per, eagle, end in product(range(2, 8), (1, 2), (1, 2, 3), (False, True), range(9)):
        needed = _needed(window, bs, per, eagle, end)
        for start in range(end + 1):
            cases += 1
            case = (window, bs, per, eagle, start, end)
            mask = stm.reachable_block_mask(SlidingWindow(bs, window), start, end, bs * per, eagle)
            if mask is None:
                expect(all(i in needed for i in range(max(start, 1), end)), "None means every block", case)
            else:
                expect(mask == [i in needed for i in range(start, end)], "exactly the needed blocks", case)
    return cases


def _identity(obj: Any) -> bytes:
    """An injective "hash": the hashed object itself."""
    return cast(bytes, obj)


_LORAS = (None, LoRA("a", 1), LoRA("b", 2))
_SALTS = (None, "s", "t")


def _chain(tokens: tuple[int, ...], hbs: int, lora: int, salt: int) -> tuple[BlockHash, ...]:
    src = ExtraKeySource(lora=_LORAS[lora], cache_salt=_SALTS[salt])
    return hashing.extend_block_hashes(_identity, BlockHash(b"seed"), hbs, (), tokens, src)


@check
@about(hashing.extend_block_hashes)
def chain_prefix_sensitive() -> int:
    """With an injective stand-in hash (the hashed tuple itself: CrossHair or
    an enumeration cannot reason about SHA-256, whose collision resistance is
    assumed), block ``j``'s hashes of two requests agree exactly when the
    requests agree on every token up to the end of block ``j`` and on their
    extra keys (LoRA, salt); and each hash names its parent and its own
    block's tokens. Tokens from {0, 1}: only their equality matters."""
    cases = 0
    for n, hbs in product(range(5), (1, 2)):
        for a, b in product(product((0, 1), repeat=n), repeat=2):
            for la, lb, sa, sb in product(range(3), repeat=4):
                cases += 1
                case = (a, b, hbs, la, lb, sa, sb)
                ha, hb = _chain(a, hbs, la, sa), _chain(b, hbs, lb, sb)
                same_extra = la == lb and sa == sb
                agree = all(
                    (ha[j] == hb[j]) == (same_extra and a[: (j + 1) * hbs] == b[: (j + 1) * hbs])
                    for j in range(len(ha))
                )
                expect(agree, "hashes agree exactly on equal prefixes and extra keys", case)
                hashed = cast(tuple[tuple[Any, ...], ...], ha)  # the stand-in returns the hashed tuples
                links = all(h[0] == (ha[j - 1] if j else b"seed") for j, h in enumerate(hashed))
                expect(links, "each hash names its parent", case)
                own = all(h[1] == a[j * hbs : (j + 1) * hbs] for j, h in enumerate(hashed))
                expect(own, "each hash names its own tokens", case)
    return cases


@check
@about(hashing.coarse_block_hashes)
def coarse_view() -> int:
    """The coarse view has one hash per whole coarse block, is the identity at
    factor 1 (last fine hash), and commutes with truncation (a prefix's view
    is a prefix), in both key forms."""
    cases = 0
    for n, hbs, factor, last in product(range(9), (1, 2), (1, 2, 3), (False, True)):
        fine = [BlockHash(bytes([i + 1])) for i in range(n)]
        view = hashing.coarse_block_hashes(fine, hbs, hbs * factor, last)
        for m in range(n + 1):
            cases += 1
            case = (n, hbs, factor, last, m)
            expect(len(view) == n // factor, "one hash per coarse block", case)
            expect(factor != 1 or not last or view == tuple(fine), "identity at factor 1", case)
            prefix = hashing.coarse_block_hashes(fine[:m], hbs, hbs * factor, last)
            expect(prefix == view[: m // factor], "commutes with truncation", case)
    return cases


@check
@about(hashing.extend_block_hashes)
def incremental_hashing() -> int:
    """Hashing a prefix first and extending later gives the hashes of hashing
    everything at once (sha256; LoRA and salt; no multimodal features: with
    them vLLM's cursor restarts at the last feature, which the spec copies)."""
    fn = hashing.get_hash_fn_by_name("sha256")
    seed = hashing.none_hash(fn, "0")
    cases = 0
    for n, hbs, salted in product(range(8), (1, 2, 3), (False, True)):
        tokens = tuple(t % 3 for t in range(n))
        src = ExtraKeySource(lora=LoRA("adapter", 1), cache_salt="salt") if salted else ExtraKeySource()
        whole = hashing.extend_block_hashes(fn, seed, hbs, (), tokens, src)
        for m in range(n + 1):
            cases += 1
            case = (n, hbs, salted, m)
            first = hashing.extend_block_hashes(fn, seed, hbs, (), tokens[:m], src)
            expect(
                hashing.extend_block_hashes(fn, seed, hbs, first, tokens, src) == whole, "incremental = at once", case
            )
    return cases
