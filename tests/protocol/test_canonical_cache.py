"""CanonicalCache gives exactly digest(doc), however the document changed."""

from hypothesis import given, settings
from hypothesis import strategies as st

from protocol.document import DEL, DROP, SET, CanonicalCache, apply_ops, digest

names = st.sampled_from([f"ns{i}" for i in range(20)])  # more than 16: the map16 header too
keys = st.sampled_from(["a", "b", "c", "zz", "0"])
values = st.recursive(st.none() | st.booleans() | st.integers(-10, 10) | st.text(max_size=3),
                      lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.text(max_size=2), inner, max_size=3), max_leaves=6)
ops = st.one_of(st.tuples(st.just(SET), names, keys, values).map(list),
                st.tuples(st.just(DEL), names, keys).map(list),
                st.tuples(st.just(DROP), names).map(list))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.lists(ops, max_size=6), max_size=12))
def test_cached_digest_equals_digest(batches):
    doc: dict = {}
    cache = CanonicalCache()
    assert cache.digest(doc) == digest(doc)
    for batch in batches:
        apply_ops(doc, batch)
        cache.invalidate(batch)
        assert cache.digest(doc) == digest(doc)
    cache.clear()
    assert cache.digest(doc) == digest(doc)
