"""CrossHair proofs of kvspec's pure functions (see proofs/README.md)."""
