"""The decision core under nova's classes: a host document as nova's objects, the vector forms of
nova's filters and weighers, the engine's index as their host table, nova's classes as the
engine's plugins.  Imports nothing of the drop-in, replay or the test harness (tests/test_layout.py).
"""
