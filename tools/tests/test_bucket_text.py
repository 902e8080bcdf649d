"""A bucket's range has one spelling: kpack::DescribeBucket (include/kpack/pack.h), which
the tools call through the extension. The tools' own copy of the rule (for runs from a
checkout without the extension) must say the same."""

import pytest

from kpack_tools import pack_dispatch as pack_module
from kpack_tools.spec import describe_bucket_index

CASES = [
    ([("M", [16, 64])], [0]),
    ([("M", [16, 64])], [1]),
    ([("M", [16, 64])], [2]),
    ([("M", [16, 64])], [3]),
    ([("M", [16, 64]), ("N", [4096])], [1, 1]),
    ([("M", [16, 64]), ("N", [4096])], []),
    ([], []),
    ([("n", [0, 2**63 - 1])], [2]),
]

EXPECTED = ["M <= 16", "17 <= M <= 64", "M >= 65", "M in no bucket (index 3 of 3)",
            "17 <= M <= 64, N >= 4097", "every bucket", "no buckets",
            "n >= 9223372036854775807"]


def test_the_tools_say_what_the_runtime_says():
    native = pack_module._native_describe_bucket()
    if native is None:
        pytest.skip("the kpack extension is not installed (pip install .)")
    for (dims, index), want in zip(CASES, EXPECTED):
        assert native(dims, index) == want
        assert describe_bucket_index(dims, index) == want


def test_the_copy_for_checkouts_without_the_extension_agrees(monkeypatch):
    monkeypatch.setattr(pack_module, "_native_describe_bucket", lambda: None)
    for (dims, index), want in zip(CASES, EXPECTED):
        assert describe_bucket_index(dims, index) == want, (dims, index)
