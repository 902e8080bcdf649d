"""Buckets that make a recorded autotuned kernel dispatch like the program did.

``triton.autotune(configs, key=[...])`` picks a config per distinct key value.  Record
mode saw which key values the program used and which config the autotuner chose for
each; this module turns that into kpack buckets over the key's integer call parameters
(``docs/record.md``, "Autotuned functions"):

- per key parameter, its recorded values ``v1 < v2 < ... < vk`` each get an interval of
  their own, ``[v, v]``; the values between two recorded ones are split at the midpoint
  ``m = floor((vi + vj) / 2)`` into ``[vi + 1, m]`` (nearest: ``vi``; a value exactly in
  the middle goes to the smaller) and ``[m + 1, vj - 1]`` (nearest: ``vj``); below ``v1``
  and above ``vk`` one interval each (nearest: ``v1``, ``vk``);
- a bucket (one interval per parameter) whose intervals are all exact and whose values
  form a recorded key is that key's: its variants carry the config the autotuner chose
  for it.  Every other bucket takes the config of the nearest recorded key: each
  parameter's nearest recorded value, then among the recorded keys the one with the
  smallest sum over the parameters of the distance in rank between recorded values (ties:
  the key the program used first).

Such buckets are *near* buckets: their variants are named ``..._near<n>_...`` (``n`` the
recorded key whose config they use), so the runtime's per-variant launch counts
(``Kernel::variant_stats``) count every launch with a key value the recording never saw.
"""

import itertools
from dataclasses import dataclass
from typing import List, Optional, Sequence, Tuple

from kpack_tools.param_types import INT64_MAX, INT64_MIN


@dataclass(frozen=True)
class Interval:
    """Values ``lo..hi`` inclusive (None: unbounded) of one key parameter, served by its
    recorded value number ``nearest``; ``exact`` when ``lo == hi`` is that value."""

    lo: Optional[int]
    hi: Optional[int]
    nearest: int
    exact: bool

    def describe(self, name: str) -> str:
        if self.exact:
            return f"{name} = {self.lo}"
        if self.lo is None:
            return f"{name} <= {self.hi}"
        if self.hi is None:
            return f"{name} >= {self.lo}"
        return f"{self.lo} <= {name} <= {self.hi}"


def intervals(values: Sequence[int]) -> List[Interval]:
    """The intervals of one key parameter, in increasing order, for its recorded
    ``values`` (distinct, any order)."""
    values = sorted(set(values))
    out: List[Interval] = []
    for i, v in enumerate(values):
        low = values[i - 1] + 1 if i else None  # first value not covered yet
        if i and low <= v - 1:
            middle = (values[i - 1] + v) // 2
            out.append(Interval(low, middle, i - 1, False))
            if middle + 1 <= v - 1:
                out.append(Interval(middle + 1, v - 1, i, False))
        elif not i and v > INT64_MIN:
            out.append(Interval(None, v - 1, 0, False))
        out.append(Interval(v, v, i, True))
    if values[-1] < INT64_MAX:
        out.append(Interval(values[-1] + 1, None, len(values) - 1, False))
    return out


@dataclass(frozen=True)
class Bucket:
    """One bucket: an interval index per key parameter, the recorded key (index into the
    recorded keys) whose config it uses, and whether it is that key exactly."""

    index: Tuple[int, ...]
    key: int
    exact: bool


@dataclass(frozen=True)
class Plan:
    """Bucket dims (``[(param, edges)]``, the format's inclusive upper edges) and every
    bucket, in manifest order (the last dim varies fastest)."""

    dims: List[Tuple[str, List[int]]]
    intervals: List[List[Interval]]
    buckets: List[Bucket]

    def describe(self, bucket: Bucket) -> str:
        return ", ".join(self.intervals[d][i].describe(self.dims[d][0])
                         for d, i in enumerate(bucket.index))


def plan(params: Sequence[str], keys: Sequence[Tuple[int, ...]],
         max_buckets: int) -> Optional[Plan]:
    """Buckets over ``params`` for the recorded ``keys`` (distinct value tuples, in the
    order the program first used them); None when they would be more than
    ``max_buckets``."""
    per_dim = [intervals([key[d] for key in keys]) for d in range(len(params))]
    count = 1
    for dim in per_dim:
        count *= len(dim)
    if count > max_buckets:
        return None
    ranks = [sorted({key[d] for key in keys}) for d in range(len(params))]
    key_ranks = [tuple(ranks[d].index(key[d]) for d in range(len(params))) for key in keys]
    buckets = []
    for index in itertools.product(*[range(len(dim)) for dim in per_dim]):
        chosen = [per_dim[d][i] for d, i in enumerate(index)]
        nearest = tuple(interval.nearest for interval in chosen)
        if all(interval.exact for interval in chosen) and nearest in key_ranks:
            buckets.append(Bucket(index, key_ranks.index(nearest), True))
            continue
        distance = [sum(abs(a - b) for a, b in zip(nearest, kr)) for kr in key_ranks]
        buckets.append(Bucket(index, distance.index(min(distance)), False))
    dims = [(name, [interval.hi for interval in dim[:-1]]) for name, dim in zip(params, per_dim)]
    return Plan(dims, per_dim, buckets)
