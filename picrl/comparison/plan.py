"""What a ``picrl compare`` run does, resolved from its arguments: the input of its run and report stages."""

from __future__ import annotations

from dataclasses import dataclass

from picrl.comparison.runner import Budget, CellCache, Protocol
from picrl.datasets import Trace
from picrl_core.config import PicRLConfig
from picrl_core.series import PreparedSeries


@dataclass(frozen=True)
class Plan:
    """The traces and their prepared series (test split cut to the budget), the methods, seeds ``0..seeds-1``,
    the budget, the base config, the protocol and the cell cache of one run."""

    traces: dict[str, Trace]
    series: dict[str, PreparedSeries]
    methods: list[str]
    seeds: int
    budget: Budget
    config: PicRLConfig
    protocol: Protocol
    cache: CellCache

    @property
    def datasets(self) -> list[str]:
        return list(self.traces)
