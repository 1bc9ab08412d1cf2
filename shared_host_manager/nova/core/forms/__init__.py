"""The vector forms of nova's filters and weighers, one module per nova module.

Role
----
``filters/<name>.py`` answers for the classes of nova's
``nova/scheduler/filters/<name>.py``, ``weights/<name>.py`` for those of
``nova/scheduler/weights/<name>.py``: an operator looking for how a class of
nova's is decided here finds it under nova's module name.  Each module declares
its classes' forms (:class:`~.base.FilterForm`, :class:`~.base.WeigherForm`);
``filters/__init__.py`` and ``weights/__init__.py`` collect them into the
registries, and :mod:`..vector` runs them.  What several forms share is in
:mod:`.base`, which imports none of them (the imports run base <- form modules
<- their package <- vector, no circle).
"""
