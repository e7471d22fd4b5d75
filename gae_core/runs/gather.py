"""Which trials train together: the batching rule both sweep backends share.

A backend with ``members > 1`` does not start a trial the moment it is submitted: it gathers
the submitted trials and hands them to its free slots (a local worker process, a Ray task) in
consecutive batches, each batch one population (one :class:`~gae_core.agent.trainer.Trainer`
of several members). Only trials whose configs can share a trainer go together
(:func:`~gae_core.agent.trainer.population_key`).

The rule is written once, here, so that a sweep splits into the same populations on either
backend and however its slots free up: a trial's numbers depend on the population it trains
in, and the same sweep gives the same per-trial metrics locally and on Ray
(``tests/test_ray.py``). Two parts make the split a function of the sweep alone:

* the coordinator submits the trials in :meth:`Gathering.dispatch_order`: each population of
  the split planned from the whole sweep (each kind's trials in consecutive batches of
  ``capacity``) as a run of consecutive trials, populations ordered by their first trial;
* a trial is gathered under its planned population, which :meth:`Gathering.can_take` always
  lets it join, so the coordinator never stops inside a population (it stops only where the
  next trial needs a slot of its own) and planned populations are never merged: a trial
  stopped before it started, or a population lost in part, only leaves a smaller one. (In
  index order, a sweep that mixes kinds — hidden sizes × seeds — would send a population out
  half gathered whenever the next trial is of the other kind and no second slot is free.)
"""

from __future__ import annotations

__all__ = ["ALONE", "Gathered", "Gathering", "population_capacity"]

#: The group of every trial when each trains alone (capacity 1).
ALONE = ("alone",)

Trial = tuple[int, str, dict]  # (trial index, run id, TrainConfig.to_dict())


def population_capacity(members: int, trials: int, workers: int) -> int:
    """The most trials one slot trains at once: ``members``, and no more than an even spread
    of the sweep over its ``workers`` (⌈trials / workers⌉), so every worker gets a share."""
    if members < 1:
        raise ValueError(f"members must be at least 1, got {members}")
    return max(1, min(members, -(-trials // max(workers, 1))))


class Gathering:
    """The trials submitted and not yet sent, and how they split into batches.

    ``capacity``: the most trials one batch holds (1: every trial alone, no config is read).
    :meth:`can_take` tells the coordinator whether one more trial would start at the next
    :meth:`take`, which hands out the batches for the backend's free slots.

    A trial is gathered under its *group*: its kind (population key, or :data:`ALONE`) and the
    number of its planned population (:meth:`dispatch_order`; -1 for a trial outside the
    plan), so planned populations are never merged (see the module docstring).
    """

    def __init__(self, capacity: int) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self.trials: list[tuple[tuple, Trial]] = []  # (group, trial), in order
        self.planned: dict[int, tuple] = {}  # trial index → its group in the plan

    def kind(self, config: dict) -> tuple:
        """The trial's population key and its budget, or :data:`ALONE` (always, at capacity 1).

        The budget too: a trainer can hold members of different budgets, but the one whose
        budget ends first then ends on a rollout of ``rollout_steps`` rows where, alone, its
        last rollout would have run on up to a quarter longer (``Trainer.collect``), so its
        last updates would not be those of its lone run."""
        if self.capacity == 1:
            return ALONE
        # imported here: with one trial per slot the coordinator never needs the trainer
        from gae_core.agent.config import TrainConfig
        from gae_core.agent.trainer import population_key

        built = TrainConfig.from_dict(config)
        return (*population_key(built), ("total_steps", built.total_steps))

    def group(self, config: dict, index: int | None = None) -> tuple:
        """(kind, planned population number or -1): what the trial is gathered under (read
        from the plan for a planned trial: its config is not built again)."""
        planned = self.planned.get(index) if index is not None else None
        return planned if planned is not None else (self.kind(config), -1)

    def _size(self, group: tuple) -> int:
        """The most trials one batch of ``group`` holds: 1 for :data:`ALONE`, else capacity."""
        return 1 if group[0] == ALONE else self.capacity

    def _chunks(self, group: tuple, items: list) -> list[list]:
        """``items`` of one group in consecutive batches of its size."""
        size = self._size(group)
        return [items[i : i + size] for i in range(0, len(items), size)]

    def dispatch_order(self, configs: list[dict]) -> list[int]:
        """Plan the sweep's populations and return the order to submit its trials ``configs``
        (by index) in: each kind's trials, in index order, in consecutive batches of
        ``capacity``, the batches one after another, ordered by their first trial (index
        order when every trial trains alone)."""
        self.planned = {}
        if self.capacity == 1:
            return list(range(len(configs)))
        kinds: dict[tuple, list[int]] = {}
        for index, config in enumerate(configs):
            kinds.setdefault(self.kind(config), []).append(index)
        batches = sorted(
            (batch, kind) for kind, indices in kinds.items()
            for batch in self._chunks((kind,), indices)
        )  # fmt: skip
        self.planned = {
            index: (kind, number) for number, (batch, kind) in enumerate(batches) for index in batch
        }
        return [index for batch, _ in batches for index in batch]

    def add(self, index: int, run_id: str, config: dict) -> None:
        self.trials.append((self.group(config, index), (index, run_id, config)))

    def batches(self, extra: tuple | None = None) -> tuple[int, int]:
        """(batches, spare room) the gathered trials, and one more of group ``extra``, form
        when :meth:`take` splits them."""
        counts: dict[tuple, int] = {}
        for group in [group for group, _ in self.trials] + ([extra] if extra else []):
            counts[group] = counts.get(group, 0) + 1
        batches = room = 0
        for group, n in counts.items():
            size = self._size(group)
            parts = -(-n // size)  # as take() splits them
            batches, room = batches + parts, room + parts * size - n
        return batches, room

    def idle_slots(self, free: int) -> int:
        """How many more trials could start now, with ``free`` slots, if they can all share
        the gathered populations: every free slot not yet spoken for by a gathered batch takes
        ``capacity``, plus the room left in the gathered batches."""
        batches, room = self.batches()
        return 0 if batches > free else (free - batches) * self.capacity + room

    def can_take(self, config: dict, free: int, index: int | None = None) -> bool:
        """Whether trial ``index`` with ``config`` would start at the next :meth:`take` with
        ``free`` slots: every gathered batch, with it added, finds one (batches, not trials,
        take slots, so a claimed trial never waits "running" at step 0)."""
        return self.batches(self.group(config, index))[0] <= free

    def take(self, free: int) -> list[list[Trial]]:
        """Up to ``free`` batches, removed from the gathered trials: each group's trials in
        consecutive batches of its size (the last one smaller), not spread over the slots free
        now, so who shares a population does not depend on when slots free up; what finds no
        slot waits for the next call."""
        if free <= 0 or not self.trials:
            return []
        groups: dict[tuple, list[Trial]] = {}
        for group, trial in self.trials:
            groups.setdefault(group, []).append(trial)
        batches = [
            batch for group, trials in groups.items() for batch in self._chunks(group, trials)
        ]
        taken = batches[:free]
        sent = {index for batch in taken for index, _, _ in batch}
        self.trials = [(k, t) for k, t in self.trials if t[0] not in sent]
        return taken


class Gathered:
    """What both pool backends answer from their :class:`Gathering` and their free slots
    (``_free()``: local worker processes, Ray tasks)."""

    gathering: Gathering

    def _free(self) -> int:
        raise NotImplementedError

    def idle_slots(self) -> int:
        """How many more trials could start now."""
        return self.gathering.idle_slots(self._free())

    def can_take(self, config: dict, index: int | None = None) -> bool:
        """Whether trial ``index`` with ``config`` would start at the next ``events()``."""
        return self.gathering.can_take(config, self._free(), index)

    def dispatch_order(self, configs: list[dict]) -> list[int]:
        return self.gathering.dispatch_order(configs)
