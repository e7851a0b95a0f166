"""Several generations as one answer: a completion with several prompts, one per choice.

``Fanout`` runs each generation (``triton_stream.generate``) in a task of its own, so each
is a request of its own to the router (admitted like any request) and all run at once; their
pieces come out in arrival order, tagged with the prompt's index. A bounded queue (one place
per generation) passes them on, so a client that reads slowly slows every generation rather
than piling pieces up in the front. The first error of any generation ends them all (with
several prompts its message says which prompt); ``aclose`` cancels every generation still
running, which closes its router stream (its KV sessions are freed). One prompt is a fanout
of one: the same path.
"""
from __future__ import annotations

import asyncio
import contextlib
import dataclasses
from typing import AsyncIterator, Optional, Sequence, Union

from .errors import OpenAIError
from .triton_stream import Piece

Item = Union[Piece, None, BaseException]  # a piece, None = that generation ended, or its error


class Fanout:
    def __init__(self, generations: Sequence[AsyncIterator[Piece]]):
        self.count = len(generations)
        self._queue: asyncio.Queue[tuple[int, Item]] = asyncio.Queue(maxsize=max(1, self.count))
        self._held: list[tuple[int, Item]] = []  # what came while ``started`` waited for every first piece
        self._open = self.count  # generations whose end ``events`` has not yet given
        self._tasks = [asyncio.ensure_future(self._pump(i, g)) for i, g in enumerate(generations)]

    async def _pump(self, index: int, generation: AsyncIterator[Piece]) -> None:
        try:
            async with contextlib.aclosing(generation):
                async for piece in generation:
                    await self._queue.put((index, piece))
            await self._queue.put((index, None))
        except Exception as exc:  # noqa: BLE001 - passed on to whoever reads the fanout
            await self._queue.put((index, exc))

    def _raise(self, index: int, error: BaseException):
        if self.count > 1 and isinstance(error, OpenAIError):
            error = dataclasses.replace(error, message=f"prompt {index}: {error.message}")
        raise error

    async def started(self) -> list[Optional[Piece]]:
        """Wait until every generation gave its first piece; those pieces by index (None: it
        ended without one). Raises the first error. Later pieces are kept for ``events``."""
        firsts: list[Optional[Piece]] = [None] * self.count
        seen: set[int] = set()
        while len(seen) < self.count:
            index, item = await self._queue.get()
            if isinstance(item, BaseException):
                self._raise(index, item)
            if index in seen or item is None:
                self._held.append((index, item))
            else:
                firsts[index] = item
            seen.add(index)
        return firsts

    async def events(self) -> AsyncIterator[tuple[int, Optional[Piece]]]:
        """(index, piece) in arrival order, and (index, None) when that generation ended, until
        every generation ended; raises the first error."""
        while self._open:
            index, item = self._held.pop(0) if self._held else await self._queue.get()
            if isinstance(item, BaseException):
                self._raise(index, item)
            if item is None:
                self._open -= 1
            yield index, item

    async def collect(self) -> list[tuple[str, dict, list]]:
        """Every generation's whole text, its last routing stats and its tokens' log-probabilities
        (the prompt's first, when asked), by index."""
        texts: list[list[str]] = [[] for _ in range(self.count)]
        stats: list[dict] = [{} for _ in range(self.count)]
        scores: list[list] = [[] for _ in range(self.count)]
        async for index, piece in self.events():
            if piece is not None:
                texts[index].append(piece.text)
                stats[index] = piece.stats
                scores[index] += piece.prompt_logprobs + piece.logprobs
        return [("".join(t), s, e) for t, s, e in zip(texts, stats, scores)]

    async def aclose(self) -> None:
        """Cancel every generation still running and wait until each has closed its stream."""
        for task in self._tasks:
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
