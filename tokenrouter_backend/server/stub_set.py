"""A server's Python stubs followed across model loads, unloads and reloads: which ones died.

The stubs alive when the server became ready are recorded; a stub that appears later (a
model loaded over the API, or the new instance of a reloaded one) is adopted. A recorded
stub that is gone counts as dead unless its model was unloaded (Triton no longer knows the
model: ``/v2/models/<name>/ready`` answers 400 or 404) or reloaded (a newer stub of the same
model is there: Triton starts the new instance before it ends the old one). Shared by
``TritonServer`` (``serve``'s supervisor) and the container watchdog (``stub_watch``).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

UNKNOWN_MODEL = (400, 404)  # Triton's answer to /v2/models/<name>/ready for a model not loaded
RELOADED, UNLOADED, DIED = "reloaded", "unloaded", "died"


@dataclass(frozen=True)
class Stub:
    model: str
    generation: int  # the look at which it was first seen (0 = at readiness)


@dataclass(frozen=True)
class Change:
    """One stub adopted or gone since the last look, and why it went (``RELOADED``, ``UNLOADED``,
    ``DIED``; None for an adopted one)."""

    pid: int
    model: str
    gone: str | None = None


class StubSet:
    """The stubs of one server run (see the module docstring)."""

    def __init__(self, stubs: dict[int, str]):
        self.stubs = {pid: Stub(model, 0) for pid, model in stubs.items()}
        self.dead: dict[int, str] = {}  # pid -> model of every stub that died (kept)
        self._generation = 0

    def follow(self, current: dict[int, str], model_status: Callable[[str], int | None]) -> list[Change]:
        """Compare with the stubs running now (pid -> model); what changed. ``model_status``
        answers the model's readiness HTTP status, asked only about a model whose stub went."""
        self._generation += 1
        changes = []
        for pid, model in current.items():
            if pid not in self.stubs:
                self.stubs[pid] = Stub(model, self._generation)
                changes.append(Change(pid, model))
        # gone from the server's process group (or a zombie): a reused pid elsewhere does not hide it
        for pid in sorted(set(self.stubs) - set(current)):
            stub = self.stubs.pop(pid)
            if any(s.model == stub.model and s.generation > stub.generation for s in self.stubs.values()):
                why = RELOADED
            elif stub.model != "?" and model_status(stub.model) in UNKNOWN_MODEL:
                why = UNLOADED
            else:
                why = DIED
                self.dead[pid] = stub.model
            changes.append(Change(pid, stub.model, why))
        return changes

    def names(self) -> dict[int, str]:
        """The model of every stub seen, the dead included (pid -> model)."""
        return {**{pid: s.model for pid, s in self.stubs.items()}, **self.dead}
