"""Ship search: the recipe that holds on every host of a fleet, found by measurement and written as a variant.

One module per part: `walk` (the walk itself and its parameters, the entry point), `space` (the candidates: global
choices, nodes kept in float, their ranking), `patterns` and `tensors` (decomposed ops and per-node tensor forms),
`evaluator` (candidates run on the hosts' workers, flips counted against fp32), `standins` (imported hosts and the
live hosts standing in for them), `latency` (the latency ceiling's measurements), `identity` (the fleet-identical
walk), `outcome` (int8 left in a candidate, the nearest one when none passes), `cache` (the sealed caches), `write`
(the chosen variant written) and `report` (the report section and the console summary).
"""

from quantbench.explain.search.walk import (MADE_BY_STATIC, SPACES, SearchParams, SearchResult, Stopped, open_walk,
                                            search, search_id, shortest_prefix)

__all__ = ["MADE_BY_STATIC", "SPACES", "SearchParams", "SearchResult", "Stopped", "open_walk", "search", "search_id",
           "shortest_prefix"]
