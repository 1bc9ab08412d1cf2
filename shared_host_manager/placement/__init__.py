"""Allocation candidates from memory: placement's ``GET /allocation_candidates`` answered without a database.

Three pure parts, no I/O:

* :mod:`.state` -- the resource providers as placement holds them
  (inventories, usages, traits, aggregates), built from plain dicts and kept
  current one provider at a time (newest generation wins);
* :mod:`.query` -- the querystring nova's report client sends, parsed and
  validated as placement parses and validates it, or the reason it is left to
  placement;
* :mod:`.candidates` -- the answer, the JSON body placement returns for that
  query on that state, or the reason the state or the query is outside the
  covered set.

The covered set: every request of microversions 1.36 (nova 34's) to 1.39, on
provider trees and sharing providers, with suffixed groups, ``same_subtree``
and ``group_policy``, except the few kinds :mod:`.candidates` lists (where
placement's own answer depends on its iteration order, or is an error) and
names the state does not know.  A request outside it returns an
:class:`~.query.Unanswered` with a reason the caller sends to placement and
counts.
"""

from shared_host_manager.placement.candidates import PlacementConfig, allocation_candidates, answer
from shared_host_manager.placement.query import REASONS, CandidateQuery, Unanswered, parse_querystring
from shared_host_manager.placement.state import ProviderState

__all__ = ["REASONS", "CandidateQuery", "PlacementConfig", "ProviderState", "Unanswered",
           "allocation_candidates", "answer", "parse_querystring"]
