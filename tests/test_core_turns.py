"""engine.core_turns: forwards of different processes take turns; a wait is bounded; nothing leaks."""
from __future__ import annotations

import multiprocessing as mp
import os
import time

import pytest

from tokenrouter_backend.engine.core_turns import CoreTurns

CTX = mp.get_context("fork")


def _hold(path: str, seconds: float, held, done) -> None:
    with CoreTurns(path, max_wait_ms=0).turn() as got:
        assert got
        held.set()
        time.sleep(seconds)
        done.set()  # inside the turn: set before the lock is let go, so a waiter that gets it sees it


def _holder(path, seconds):
    held, done = CTX.Event(), CTX.Event()
    proc = CTX.Process(target=_hold, args=(str(path), seconds, held, done))
    proc.start()
    assert held.wait(30), "the holder never got its turn"
    return proc, done


def _open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def test_a_turn_waits_for_the_other_process(tmp_path):
    turns = CoreTurns(tmp_path, max_wait_ms=10_000)
    proc, done = _holder(tmp_path, 0.6)
    try:
        t0 = time.perf_counter()
        with turns.turn() as got:
            waited = time.perf_counter() - t0
            assert got and done.is_set()  # it ran only after the holder let go
        assert 0.3 < waited < 5
        assert (turns.stats.turns, turns.stats.overlaps) == (1, 0)
        assert turns.stats.waited_ms == pytest.approx(turns.last_wait_ms) and turns.last_wait_ms > 300
    finally:
        proc.join(10)
        proc.close()


def test_a_wait_is_bounded_and_an_abandoned_wait_lets_go(tmp_path):
    before = _open_fds()
    turns = CoreTurns(tmp_path, max_wait_ms=150)
    proc, done = _holder(tmp_path, 1.0)
    try:
        t0 = time.perf_counter()
        with turns.turn() as got:
            assert not got and not done.is_set()  # ran beside the holder, after the bound
        assert 0.1 < time.perf_counter() - t0 < 0.9
        assert (turns.stats.turns, turns.stats.overlaps) == (0, 1)
    finally:
        proc.join(10)
        proc.close()
    # the abandoned helper acquired the lock when the holder let go and released it at once
    t0 = time.perf_counter()
    with turns.turn() as got:
        assert got
    assert time.perf_counter() - t0 < 0.1
    deadline = time.monotonic() + 5
    while _open_fds() > before and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _open_fds() == before


def test_zero_wait_never_waits_and_turns_are_reentrant_across_calls(tmp_path):
    turns = CoreTurns(tmp_path, max_wait_ms=0)
    for _ in range(3):
        with turns.turn() as got:
            assert got
    proc, done = _holder(tmp_path, 0.5)
    try:
        t0 = time.perf_counter()
        with turns.turn() as got:
            assert not got
        assert time.perf_counter() - t0 < 0.1
    finally:
        proc.join(10)
        proc.close()
    assert (turns.stats.turns, turns.stats.overlaps) == (3, 1)


def test_bad_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="does not exist"):
        CoreTurns(tmp_path / "missing", 10)
    with pytest.raises(ValueError, match="max_wait_ms must be >= 0"):
        CoreTurns(tmp_path, -1)


def test_a_run_keeps_its_turn_for_a_slice_then_gives_it_back(tmp_path):
    turns = CoreTurns(tmp_path, max_wait_ms=0, slice_ms=300)
    other = CoreTurns(tmp_path, max_wait_ms=0)
    with turns.run():
        with turns.turn() as got:
            assert got
        with other.turn() as got:
            assert not got  # between forwards of one run the turn is still held
        with turns.turn() as got:
            assert got and turns.last_wait_ms == 0.0
        time.sleep(0.35)
        with turns.turn() as got:  # slice over: given back, taken again (free: no wait)
            assert got
    with other.turn() as got:
        assert got  # the run ended: the turn is free
    with turns.turn() as got:  # outside a run, a turn ends with its forward
        assert got
    with other.turn() as got:
        assert got
    assert (turns.stats.turns, turns.stats.overlaps) == (4, 0)
    assert (other.stats.turns, other.stats.overlaps) == (2, 1)
