"""The hash chain of :func:`kvspec.hashing.extend_block_hashes`.

A block's hash must change when any earlier token or any extra key (LoRA
adapter, cache salt) changes, and only then. CrossHair cannot reason about
SHA-256, so these harnesses inject an *injective stand-in* as the hash
function: :func:`_identity` returns the hashed tuple ``(parent, tokens,
extra_keys)`` itself. This checks the chaining structure (each hash takes
its parent, its own tokens and its extra keys); that SHA-256 and xxh3 keep
distinct inputs apart is assumed (collision resistance), not proved.
Multimodal features are not in the domain.
"""

from __future__ import annotations

from typing import Any, cast

from kvproofs.holds import unenforced
from kvspec.hashing import BlockHash, ExtraKeySource, LoRA, extend_block_hashes

_LORAS = (None, LoRA("a", 1), LoRA("b", 2))
_SALTS = (None, "s", "t")


def _identity(obj: Any) -> bytes:
    """An injective "hash": the hashed object itself."""
    return cast(bytes, obj)


def _chain(tokens: list[int], hbs: int, lora: int, salt: int) -> tuple[BlockHash, ...]:
    src = ExtraKeySource(lora=_LORAS[lora], cache_salt=_SALTS[salt])
    return unenforced(extend_block_hashes)(_identity, BlockHash(b"seed"), hbs, (), tokens, src)


def chain_prefix_sensitive(a: list[int], b: list[int], hbs: int, la: int, lb: int, sa: int, sb: int) -> bool:
    """Block ``j``'s hashes agree exactly when the two requests agree on every
    token up to the end of block ``j`` and on their extra keys.

    pre: len(a) == len(b) <= 4 and 1 <= hbs <= 2
    pre: 0 <= la <= 2 and 0 <= lb <= 2 and 0 <= sa <= 2 and 0 <= sb <= 2
    post: __return__
    """
    # crosshair: max_iterations=60
    ha, hb = _chain(a, hbs, la, sa), _chain(b, hbs, lb, sb)
    same_extra = la == lb and sa == sb
    return all((ha[j] == hb[j]) == (same_extra and _same_prefix(a, b, (j + 1) * hbs)) for j in range(len(ha)))


def _own_tokens(got: tuple[int, ...], tokens: list[int], start: int, hbs: int) -> bool:
    return len(got) == hbs and all(got[k] == tokens[start + k] for k in range(hbs))


def _same_prefix(a: list[int], b: list[int], n: int) -> bool:
    # Element by element: CrossHair 0.0.113 can answer False for ``a[:n] == b[:n]``
    # on equal symbolic lists (see proofs/README.md, "CrossHair pitfalls").
    return all(a[i] == b[i] for i in range(n))


def chain_parent_link(tokens: list[int], hbs: int, lora: int, salt: int) -> tuple[BlockHash, ...]:
    """Every hash names its parent (the previous hash, the seed for block 0)
    and its own block's tokens.

    pre: len(tokens) <= 6 and 1 <= hbs <= 3 and 0 <= lora <= 2 and 0 <= salt <= 2
    post: all(h[0] == (__return__[j - 1] if j else b"seed") for j, h in enumerate(__return__))
    post: all(_own_tokens(h[1], tokens, j * hbs, hbs) for j, h in enumerate(__return__))
    """
    # crosshair: max_iterations=100
    return _chain(tokens, hbs, lora, salt)
