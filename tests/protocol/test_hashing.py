"""The GIL-keeping digests equal hashlib's and hmac's, whatever the input size."""

from __future__ import annotations

import hashlib
import hmac

from hypothesis import given
from hypothesis import strategies as st

from protocol import hashing

# around and far beyond the size at which hashlib would release the GIL
sizes = st.sampled_from([0, 1, 2046, 2047, 2048, 2049, 4094, 4095, 10_000, 70_001])
payloads = st.one_of(st.binary(max_size=5000), sizes.map(lambda n: bytes(i % 251 for i in range(n))))


@given(st.lists(payloads, max_size=4), st.sampled_from([8, 16, 32, 64]))
def test_blake2b_of_chunks_is_blake2b_of_their_concatenation(chunks, size):
    assert hashing.blake2b(chunks, size) == hashlib.blake2b(b"".join(chunks), digest_size=size).digest()


@given(st.binary(max_size=80), payloads)
def test_hmac_sha256_is_hmacs(key, payload):
    assert hashing.hmac_sha256(key, payload) == hmac.new(key, payload, hashlib.sha256).digest()


def test_updates_stay_below_the_size_that_releases_the_gil():
    seen = []

    class Spy:
        def update(self, data):
            seen.append(len(data))

    hashing.update(Spy(), bytes(10_000))
    assert sum(seen) == 10_000 and max(seen) < hashing.GIL_RELEASE_SIZE


@given(payloads)
def test_crc32_is_zlibs(payload):
    import zlib

    assert hashing.crc32(payload) == zlib.crc32(payload)
