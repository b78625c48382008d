"""The feature modules' rules and how their switches relate across releases.

:mod:`kvspec.partial_tail` (partial-tail entries, 0.26.0 on),
:mod:`kvspec.mamba_tail` (Mamba tail entries) and :mod:`kvspec.partial_hits`
(fine-grained hits): the spec's own contracts of their pure rules are checked
directly (``proofs/kvproofs/contracts.py``); these harnesses state what the
rules do together and between the releases that switch them.
"""

from __future__ import annotations

from kvproofs.contracts import about
from kvproofs.holds import unenforced
from kvspec.config import FULL_TYPE_KINDS, AttentionKind, Mamba  # noqa: F401 - the contracts below name them
from kvspec.mamba_tail import mamba_tail_boundary, mamba_tail_index
from kvspec.partial_hits import blocks_fine_hits, eagle_margin, fine_grained
from kvspec.partial_tail import fa_tail_boundary, partial_tail_index


def _fa(n: int, hbs: int, eagle: bool, below: bool) -> int:
    return unenforced(fa_tail_boundary)(n, hbs, eagle, below)


def _mamba(n: int, hbs: int, drop: bool, below: bool) -> int:
    return unenforced(mamba_tail_boundary)(n, hbs, drop, below)


@about(fa_tail_boundary, partial_tail_index)
def partial_tail_releases(n: int, hbs: int, k: int, eagle: bool, num_tokens: int) -> int | None:
    """The 0.32.0 tail (``fa_tail_below_last_token``) is the 0.26.0 tail, one
    hash unit lower when the prompt ends on a hash boundary (a resend
    recomputes its last token), never for an EAGLE group; the entry goes on
    the block holding the boundary's last token, inside it, once
    ``num_tokens`` reaches the boundary.

    pre: 0 <= n <= 64 and 1 <= hbs <= 4 and 1 <= k <= 4 and 0 <= num_tokens <= 64
    post: _fa(n, hbs, eagle, True) == _fa(n, hbs, eagle, False) - (hbs if not eagle and n % hbs == 0 and n > 0 else 0)
    post: __return__ is None or __return__ * hbs * k < _fa(n, hbs, eagle, True) <= min(num_tokens, (__return__ + 1) * hbs * k)
    post: __return__ is not None or _fa(n, hbs, eagle, True) % (hbs * k) == 0 or _fa(n, hbs, eagle, True) > num_tokens
    """  # noqa: E501 - a PEP 316 condition is one line
    # crosshair: max_iterations=1000
    return unenforced(partial_tail_index)(_fa(n, hbs, eagle, True), num_tokens, hbs * k)


@about(mamba_tail_boundary, mamba_tail_index)
def mamba_tail_releases(n: int, hbs: int, k: int, drop: bool, num_tokens: int) -> int | None:
    """The 0.32.0 Mamba tail (``mamba_tail_entries``) is the 0.26.0 one, one
    hash unit lower when the prompt ends on a hash boundary, except under
    EAGLE, which lowers both by a unit; 0.32.0 keys every boundary 0.26.0
    keys (those inside a block) and also those on a block's end.

    pre: 0 <= n <= 64 and 1 <= hbs <= 4 and 1 <= k <= 4 and 0 <= num_tokens <= 64
    post: drop or _mamba(n, hbs, False, True) == _mamba(n, hbs, False, False) - (hbs if n % hbs == 0 and n > 0 else 0)
    post: not drop or _mamba(n, hbs, True, True) == _mamba(n, hbs, True, False) == max(_mamba(n, hbs, False, False) - hbs, 0)
    post: __return__ is None or __return__ == unenforced(mamba_tail_index)(num_tokens, _mamba(n, hbs, drop, True), hbs, hbs * k, True)
    post: __return__ is not None or unenforced(mamba_tail_index)(num_tokens, _mamba(n, hbs, drop, True), hbs, hbs * k, True) is None or num_tokens % (hbs * k) == 0
    """  # noqa: E501 - a PEP 316 condition is one line
    # crosshair: max_iterations=1000
    return unenforced(mamba_tail_index)(num_tokens, _mamba(n, hbs, drop, True), hbs, hbs * k, False)


@about(fine_grained, blocks_fine_hits, eagle_margin)
def fine_hit_roles(kind: AttentionKind, hbs: int) -> bool:
    """At hash granularity ``hbs`` (which divides every cacheable block): a
    group either looks up inside its blocks, blocks fine-grained hits or has
    blocks of one hash unit; only full-attention kinds and Mamba look inside;
    an EAGLE full-attention group that does looks one hash unit ahead.

    pre: 1 <= hbs <= 4 and kind.block_size <= 8 and kind.block_size % hbs == 0
    post: __return__ + unenforced(blocks_fine_hits)(kind, hbs) + (kind.block_size == hbs) == 1
    post: not __return__ or isinstance(kind, (*FULL_TYPE_KINDS, Mamba))
    post: not __return__ or isinstance(kind, Mamba) or unenforced(eagle_margin)(kind, hbs, True) == hbs
    """
    # crosshair: max_iterations=1000
    return unenforced(fine_grained)(kind, hbs)
