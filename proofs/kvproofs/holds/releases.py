"""Hashing rules of vLLM 0.16.0 against the later releases'.

0.16.0 keys a coarse block by the concatenation of its fine hashes
(``coarse_hash_last_fine`` off) and a multimodal feature by its bare
identifier, also on the block that starts at the feature's end
(``mm_key_with_offset`` off, :func:`kvspec.request.key_forms`).
"""

from __future__ import annotations

from kvproofs.contracts import about
from kvproofs.holds import unenforced
from kvspec.hashing import BlockHash, ExtraKeySource, MultiModalFeature, block_extra_keys, coarse_block_hashes


def _coarse(n: int, hbs: int, factor: int, last: bool) -> tuple[BlockHash, ...]:
    fine = [BlockHash(bytes([i + 1])) for i in range(n)]
    return unenforced(coarse_block_hashes)(fine, hbs, hbs * factor, last)


@about(coarse_block_hashes)
def coarse_forms(n: int, hbs: int, factor: int) -> tuple[BlockHash, ...]:
    """The 0.16.0 key of each coarse block is its fine hashes joined, which
    ends with the later releases' key (the last fine hash): one key per
    block in either form, the same at one fine hash per block. Distinct fine
    hashes stand for any (the rule never looks inside them).

    pre: 0 <= n <= 6 and 1 <= hbs <= 3 and 1 <= factor <= 3
    post: len(__return__) == len(_coarse(n, hbs, factor, True)) == n // factor
    post: all(old.endswith(new) and len(old) == factor * len(new) for old, new in zip(__return__, _coarse(n, hbs, factor, True)))
    post: factor != 1 or __return__ == _coarse(n, hbs, factor, True)
    """  # noqa: E501 - a PEP 316 condition is one line
    # crosshair: max_iterations=1000
    return _coarse(n, hbs, factor, False)


def _mm_keys(offset: int, length: int, start: int, size: int, v025: bool) -> tuple[object, ...]:
    src = ExtraKeySource(mm_features=(MultiModalFeature("x", offset, length),))
    return unenforced(block_extra_keys)(src, start, start + size, 0, False, v025)[0] or ()


@about(block_extra_keys)
def mm_key_forms(offset: int, length: int, start: int, size: int) -> tuple[object, ...]:
    """A feature overlapping the block is keyed ``("x", offset - start)`` from
    0.25.1 on and ``"x"`` before; 0.16.0 also keys the block that starts
    exactly at the feature's end.

    pre: 0 <= offset <= 6 and 1 <= length <= 3 and 0 <= start <= 8 and 1 <= size <= 3
    post: __return__ == tuple(k[0] for k in _mm_keys(offset, length, start, size, True)) or (__return__ == ("x",) and start == offset + length)
    post: all(k == ("x", offset - start) for k in _mm_keys(offset, length, start, size, True))
    """  # noqa: E501 - a PEP 316 condition is one line
    # crosshair: max_iterations=1000
    return _mm_keys(offset, length, start, size, False)
