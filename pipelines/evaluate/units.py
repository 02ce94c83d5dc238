"""The plan in units a shard runs: which units are this shard's, each finished unit on disk, and all of
them read back for the merge.

A unit is what must run in one process: a prompt's runs (the oracle and the ceiling read that prompt's
earlier results), a batch's runs (throughput: every method on one batch, interleaved), or, where a stream
bandit keeps its state across the prompts of a (set, domain), all of those prompts' runs. Unit i belongs
to shard i mod N, so N processes (`--shard i/N`, Slurm array tasks, torchrun ranks) split the plan
without talking to each other. A finished unit is one JSON file in the stage's work dir, written
atomically: its records and the calibration samples taken while it ran. "Done" is the set of files
present, so a killed shard redoes only its own unfinished units. The merge reads every unit back and puts
the records in plan order: the counts, and everything made from them, are those of one process running
the whole plan.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from specdraft.core.errors import InputError
from specdraft.pipelines.evaluate.plan import Run
from specdraft.pipelines.evaluate.run import Record
from specdraft.pipelines.shards import read_piece, write_json_atomic


@dataclass(frozen=True)
class Unit:
    index: int
    name: str  # "stream <set>/<domain>" or "prompt <set>/<id>"
    runs: tuple[Run, ...]

    def path(self, store: Path) -> Path:
        return store / f"unit-{self.index:05d}.json"


def units(plan: list[Run]) -> list[Unit]:
    """The plan's units in the order their first run appears in it (the plan's runs keep their order)."""
    streams = {(r.prompt.set, r.prompt.domain) for r in plan if not r.repeatable}
    groups: dict[str, list[Run]] = {}
    for r in plan:
        p = r.prompt
        name = f"stream {p.set}/{p.domain}" if (p.set, p.domain) in streams else f"prompt {p.set}/{p.id}"
        groups.setdefault(name, []).append(r)
    return [Unit(i, name, tuple(runs)) for i, (name, runs) in enumerate(groups.items())]


def share(all_units: list[Unit], shard: int, n_shards: int) -> list[Unit]:
    """Shard `shard` of `n_shards`'s units: unit i belongs to shard i mod N."""
    return [u for u in all_units if u.index % n_shards == shard]


def run_units(todo: list[Unit], store: Path, execute: Callable[[list[Run]], list[Record]],
              take_samples: Callable[[], dict[str, Any]]) -> None:
    """Runs each unit, writing its file (records and the calibration samples taken meanwhile) when it ends."""
    for u in todo:
        records = execute(list(u.runs))
        write_json_atomic(u.path(store), {"unit": u.name, "records": [r.as_json() for r in records],
                                          "calibration": take_samples()})


def missing(all_units: list[Unit], store: Path) -> list[Unit]:
    return [u for u in all_units if not u.path(store).exists()]


def read_back(plan: list[Run], all_units: list[Unit], store: Path) -> tuple[list[Record], list[dict[str, Any]]]:
    """Every unit's records in plan order (where one process running the plan puts them), and every
    unit's calibration samples."""
    records, samples = [], []
    for u in all_units:
        parsed: list[Record] = []

        def check(stored, u=u, parsed=parsed):
            if not isinstance(stored["unit"], str) or not isinstance(stored["calibration"], dict):
                raise TypeError("'unit' must be a string and 'calibration' an object")
            if stored["unit"] != u.name:
                raise ValueError(f"it holds unit '{stored['unit']}', the plan has '{u.name}' there")
            parsed.extend(Record.from_json(r) for r in stored["records"])
            # one record per run of the unit: a lost or extra record would change the report's counts silently
            got = Counter((rec.set, rec.prompt, rec.key) for rec in parsed)
            if got != Counter((r.prompt.set, r.prompt.id, r.key) for r in u.runs):
                raise ValueError(f"its {len(parsed)} records are not those of the unit's {len(u.runs)} runs")

        stored = read_piece(u.path(store), "evaluate unit", check)
        records += parsed
        samples.append(stored["calibration"])
    position = {(r.prompt.set, r.prompt.id, r.key): i for i, r in enumerate(plan)}
    return sorted(records, key=lambda rec: position[(rec.set, rec.prompt, rec.key)]), samples


def unfinished_error(left: list[Unit], total: int) -> InputError:
    """`--merge` before every unit has its records."""
    names = ", ".join(u.name for u in left[:3]) + (", ..." if len(left) > 3 else "")
    return InputError(f"evaluate --merge: {len(left)} of {total} units have no records yet ({names}); run the "
                      "shards that own them first (unit i belongs to shard i mod N)")
