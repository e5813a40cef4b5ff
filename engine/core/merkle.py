"""Merkle trees as RFC 6962 (and RFC 9162, section 2.1) define them: hashes, inclusion and consistency proofs.

A checkpoint commits to every task's head with one root hash. The hashing is the
standard one, so any Certificate Transparency verifier agrees with it: a leaf is
`sha256(0x00 || data)`, an interior node `sha256(0x01 || left || right)`, the
empty tree `sha256("")`, and a tree of n > 1 leaves splits at the largest power
of two smaller than n. The tests hold this module to the published test vectors.

Proofs are computed from `Levels`, the tree's node hashes built once (each level
pairs the one below, an unpaired last node moving up as it is: the same tree the
recursive definition gives), so a proof costs O(log n) hashes after one O(n) build.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

_LEAF = b"\x00"
_NODE = b"\x01"
EMPTY_ROOT = hashlib.sha256(b"").digest()


def leaf_hash(data: bytes) -> bytes:
    return hashlib.sha256(_LEAF + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(_NODE + left + right).digest()


def _split(n: int) -> int:
    """The largest power of two smaller than n (n > 1): where RFC 6962 splits a tree of n leaves."""
    return 1 << ((n - 1).bit_length() - 1)


class Levels:
    """Every node hash of the tree over `leaves` (leaf hashes), bottom level first."""

    def __init__(self, leaves: Sequence[bytes]) -> None:
        self.size = len(leaves)
        levels = [list(leaves)]
        sha256 = hashlib.sha256
        while len(levels[-1]) > 1:
            below = levels[-1]
            above = [sha256(_NODE + below[i] + below[i + 1]).digest() for i in range(0, len(below) - 1, 2)]
            if len(below) % 2:
                above.append(below[-1])
            levels.append(above)
        self._levels = levels

    def root(self) -> bytes:
        return self._levels[-1][0] if self.size else EMPTY_ROOT

    def inclusion_proof(self, index: int) -> list[bytes]:
        """The audit path of leaf `index`, from the leaf's sibling up (RFC 6962 PATH)."""
        if not 0 <= index < self.size:
            raise IndexError(f"leaf {index} is not in a tree of {self.size}")
        proof = []
        for level in self._levels[:-1]:
            sibling = index ^ 1
            if sibling < len(level):
                proof.append(level[sibling])
            index >>= 1
        return proof

    def range_hash(self, start: int, end: int) -> bytes:
        """The hash of the subtree over leaves [start, end) as the recursive definition builds it."""
        n = end - start
        if n == 1:
            return self._levels[0][start]
        if n & (n - 1) == 0 and start % n == 0:  # a complete, aligned subtree: one of the stored nodes
            return self._levels[n.bit_length() - 1][start // n]
        k = _split(n)
        return node_hash(self.range_hash(start, start + k), self.range_hash(start + k, end))

    def consistency_proof(self, old_size: int) -> list[bytes]:
        """The proof that the tree of the first `old_size` leaves is a prefix of this one (RFC 6962 PROOF)."""
        if not 0 <= old_size <= self.size:
            raise IndexError(f"a tree of {old_size} is not a prefix of a tree of {self.size}")
        if old_size in (0, self.size):
            return []
        return self._subproof(old_size, 0, self.size, True)

    def _subproof(self, m: int, start: int, end: int, whole: bool) -> list[bytes]:
        n = end - start
        if m == n:
            return [] if whole else [self.range_hash(start, end)]
        k = _split(n)
        if m <= k:
            return [*self._subproof(m, start, start + k, whole), self.range_hash(start + k, end)]
        return [*self._subproof(m - k, start + k, end, False), self.range_hash(start, start + k)]


def root_of(leaves: Sequence[bytes]) -> bytes:
    return Levels(leaves).root()


class RootBuilder:
    """The root of a tree fed one leaf hash at a time, in O(log n) memory: a checkpoint of a million tasks
    never holds the tree. It keeps the roots of the complete subtrees so far (a compact range), largest first."""

    def __init__(self) -> None:
        self.size = 0
        self._stack: list[bytes] = []

    def add(self, leaf: bytes) -> None:
        self.size += 1
        node, merges = leaf, (self.size & -self.size).bit_length() - 1  # trailing zeros: subtrees this leaf completes
        for _ in range(merges):
            node = node_hash(self._stack.pop(), node)
        self._stack.append(node)

    def root(self) -> bytes:
        if not self._stack:
            return EMPTY_ROOT
        node = self._stack[-1]
        for left in reversed(self._stack[:-1]):
            node = node_hash(left, node)
        return node


def verify_inclusion(index: int, size: int, leaf: bytes, proof: Sequence[bytes], root: bytes) -> bool:
    """Whether `proof` shows leaf hash `leaf` at `index` in the tree of `size` leaves with `root` (RFC 9162 2.1.3.2)."""
    if not 0 <= index < size:
        return False
    fn, sn, r = index, size - 1, leaf
    for p in proof:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn and not fn & 1:
                    fn, sn = fn >> 1, sn >> 1
        else:
            r = node_hash(r, p)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and r == root


def verify_consistency(old_size: int, size: int, old_root: bytes, root: bytes, proof: Sequence[bytes]) -> bool:
    """Whether `proof` shows the tree (`old_size`, `old_root`) is a prefix of (`size`, `root`) (RFC 9162 2.1.4.2)."""
    if not 0 <= old_size <= size:
        return False
    if old_size == size:
        return not proof and old_root == root
    if old_size == 0:
        return not proof
    if not proof:
        return False
    path = list(proof)
    if old_size & (old_size - 1) == 0:  # a power of two: the old root is itself the first node of the path
        path.insert(0, old_root)
    fn, sn = old_size - 1, size - 1
    while fn & 1:
        fn, sn = fn >> 1, sn >> 1
    fr = sr = path[0]
    for c in path[1:]:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            fr, sr = node_hash(c, fr), node_hash(c, sr)
            while fn and not fn & 1:
                fn, sn = fn >> 1, sn >> 1
        else:
            sr = node_hash(sr, c)
        fn, sn = fn >> 1, sn >> 1
    return sn == 0 and fr == old_root and sr == root
