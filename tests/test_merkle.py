"""The Merkle code agrees with RFC 6962's published test vectors, and no altered proof verifies.

The vectors are the ones transparency-dev/merkle publishes (testonly/constants.go, proof/verify_test.go): the
same leaves, roots and proofs every Certificate Transparency implementation is held to.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from engine.core.merkle import (
    EMPTY_ROOT,
    Levels,
    RootBuilder,
    leaf_hash,
    root_of,
    verify_consistency,
    verify_inclusion,
)

LEAVES = [
    bytes.fromhex(h)
    for h in ("", "00", "10", "2021", "3031", "40414243", "5051525354555657", "606162636465666768696a6b6c6d6e6f")
]
ROOTS = [
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855",
    "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
    "fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125",
    "aeb6bcfe274b70a14fb067a5e5578264db0fa9b51af5e0ba159158f329e06e77",
    "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
    "4e3bbb1f7b478dcfe71fb631631519a3bca12c9aefca1612bfce4c13a86264d4",
    "76e67dadbcdf1e10e1b74ddc608abd2f98dfb16fbce75277b5232a127f2087ef",
    "ddb89be403809e325750d3d263cd78929c2942b7942a34b77e122c9594a74c8c",
    "5dc9da79a70659a9ad559cb701ded9a2ab9d823aad2f4960cfe370eff4604328",
]
#: (leaf index, tree size, proof): RFC 6962 inclusion proofs.
INCLUSION = [
    (
        0,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        5,
        8,
        [
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (2, 3, ["fac54203e7cc696cf0dfcb42c92a1d9dbaf70ad9e621f4bd8d98662f00e3c125"]),
    (
        1,
        5,
        [
            "6e340b9cffb37a989ca544e6bb780a2c78901d3fb33738768511a30617afa01d",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
    (0, 1, []),
]
#: (old size, new size, proof): RFC 6962 consistency proofs.
CONSISTENCY = [
    (
        1,
        8,
        [
            "96a296d224f285c67bee93c30f8a309157f0daa35dc5b87e410b78630a09cfc7",
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "6b47aaf29ee3c2af9af889bc1fb9254dabd31177f16232dd6aab035ca39bf6e4",
        ],
    ),
    (
        6,
        8,
        [
            "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "ca854ea128ed050b41b35ffc1b87b8eb2bde461e9e3b5596ece6b9d5975a0ae0",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
    (
        2,
        5,
        [
            "5f083f0a1a33ca076a95279832580db3e0ef4584bdff1f54c8a360f50de3031e",
            "bc1a0643b12e4d2d7c77918f44e0f4f79a838b6cf9ec5b5c283e1f4d88599e6b",
        ],
    ),
    (
        6,
        7,
        [
            "0ebc5d3437fbe2db158b9f126a1d118e308181031d0a949f8dededebc558ef6a",
            "b08693ec2e721597130641e8211e7eedccb4c26413963eee6c1e2ed16ffb1a5f",
            "d37ee418976dd95753c1c73862b9398fa2a2cf9b4ff0fdfe8b30cd95209614b7",
        ],
    ),
]
HASHES = [leaf_hash(data) for data in LEAVES]
SOME = bytes.fromhex("abacaba000000000000000000000000000000000000000000060061e00123456")


def test_roots_are_rfc_6962s_for_every_size() -> None:
    assert EMPTY_ROOT.hex() == ROOTS[0]
    streamed = RootBuilder()
    assert streamed.root().hex() == ROOTS[0]
    for size in range(len(HASHES) + 1):
        assert root_of(HASHES[:size]).hex() == ROOTS[size]
        if size:
            streamed.add(HASHES[size - 1])
            assert streamed.root().hex() == ROOTS[size], f"the streamed root of {size} leaves"


@pytest.mark.parametrize(("index", "size", "proof"), INCLUSION)
def test_inclusion_proofs_are_the_published_ones_and_no_altered_one_verifies(
    index: int, size: int, proof: list[str]
) -> None:
    path = [bytes.fromhex(p) for p in proof]
    root, leaf = bytes.fromhex(ROOTS[size]), HASHES[index]
    assert Levels(HASHES[:size]).inclusion_proof(index) == path
    assert verify_inclusion(index, size, leaf, path, root)
    wrong = [
        (index + 1, size, leaf, path, root),
        (index ^ 2, size, leaf, path, root),
        (index, size * 2, leaf, path, root),
        (index, size, leaf_hash(b"WrongLeaf"), path, root),
        (index, size, leaf, path, EMPTY_ROOT),
        (index, size, leaf, path, SOME),
        (index, size, leaf, [*path, root], root),
        (index, size, leaf, [root, *path], root),
        *[
            (index, size, leaf, [p if j != i else bytes([p[0] ^ 8]) + p[1:] for j, p in enumerate(path)], root)
            for i in range(len(path))
        ],
    ]
    if size > 1:
        wrong.append((index, size // 2, leaf, path, root))
    if index > 0:
        wrong.append((index - 1, size, leaf, path, root))
    if path:
        wrong.append((index, size, leaf, path[:-1], root))
    for probe in wrong:
        assert not verify_inclusion(*probe), probe


@pytest.mark.parametrize(("old", "new", "proof"), CONSISTENCY)
def test_consistency_proofs_are_the_published_ones_and_no_altered_one_verifies(
    old: int, new: int, proof: list[str]
) -> None:
    path = [bytes.fromhex(p) for p in proof]
    old_root, new_root = bytes.fromhex(ROOTS[old]), bytes.fromhex(ROOTS[new])
    assert Levels(HASHES[:new]).consistency_proof(old) == path
    assert verify_consistency(old, new, old_root, new_root, path)
    wrong = [
        (old - 1, new, old_root, new_root, path),
        (old + 1, new, old_root, new_root, path),
        (old ^ 2, new, old_root, new_root, path),
        (old, new * 2, old_root, new_root, path),
        (old, new // 2, old_root, new_root, path),
        (old, new, SOME, new_root, path),
        (old, new, old_root, SOME, path),
        (old, new, new_root, old_root, path),
        (old, new, old_root, new_root, []),
        (old, new, old_root, new_root, [*path, old_root]),
        (old, new, old_root, new_root, [*path, new_root]),
        (old, new, old_root, new_root, [old_root, *path]),
        (old, new, old_root, new_root, [path[0], *path]),
        (old, new, old_root, new_root, path[:-1]),
        *[
            (old, new, old_root, new_root, [p if j != i else bytes([p[0] ^ 16]) + p[1:] for j, p in enumerate(path)])
            for i in range(len(path))
        ],
    ]
    for probe in wrong:
        assert not verify_consistency(*probe), probe


def test_the_trivial_consistency_cases_are_rfc_9162s() -> None:
    assert verify_consistency(0, 0, SOME, SOME, [])
    assert verify_consistency(3, 3, SOME, SOME, [])
    assert not verify_consistency(3, 3, SOME, EMPTY_ROOT, [])
    assert not verify_consistency(3, 3, SOME, SOME, [EMPTY_ROOT])
    assert not verify_consistency(2, 1, SOME, SOME, [])
    assert not verify_consistency(1, 2, SOME, EMPTY_ROOT, [])


@given(st.lists(st.binary(max_size=8), min_size=1, max_size=70), st.data())
def test_every_proof_of_every_tree_verifies(data: list[bytes], draw: st.DataObject) -> None:
    leaves = [leaf_hash(d) for d in data]
    levels = Levels(leaves)
    root = levels.root()
    index = draw.draw(st.integers(0, len(leaves) - 1))
    assert verify_inclusion(index, len(leaves), leaves[index], levels.inclusion_proof(index), root)
    streamed = RootBuilder()
    for leaf in leaves:
        streamed.add(leaf)
    assert streamed.root() == root and streamed.size == len(leaves)
    old = draw.draw(st.integers(1, len(leaves)))
    old_root = root_of(leaves[:old])
    assert levels.range_hash(0, old) == old_root
    assert verify_consistency(old, len(leaves), old_root, root, levels.consistency_proof(old))
