"""Queue adapters that let the fences see a whole batch before the provider handles it item by item.

The provider dequeues creation jobs and watcher results one at a time from Manager queues.
To read the DB once per batch (not once per pod) the executor swaps in one of these adapters for
the duration of the provider's own loop: it serves an already-fetched batch and forwards
re-queues (``put``) to the real queue. Nothing of the provider's loop is copied.
"""

from __future__ import annotations

from collections import deque
from queue import Empty
from typing import Any, Callable, Generic, Iterable, TypeVar

T = TypeVar("T")


def drain(queue: Any, limit: int | None = None) -> list:
    """Take up to ``limit`` items (all if None) from a (Joinable)Queue, marking each done."""
    items: list = []
    while limit is None or len(items) < limit:
        try:
            item = queue.get_nowait()
        except Empty:
            break
        items.append(item)
        queue.task_done()
    return items


class BatchQueue(Generic[T]):
    """Serves a prefetched batch; ``put`` goes back to the real queue for a later loop."""

    def __init__(self, real: Any, items: Iterable[T]):
        self._real = real
        self._items: deque[T] = deque(items)
        self.served: list[T] = []

    def get_nowait(self) -> T:
        if not self._items:
            raise Empty
        item = self._items.popleft()
        self.served.append(item)
        return item

    def get(self, *args: Any, **kwargs: Any) -> T:
        return self.get_nowait()

    def put(self, item: T, *args: Any, **kwargs: Any) -> None:
        self._real.put(item)

    def task_done(self) -> None:
        """The batch was marked done on the real queue when it was fetched."""

    def qsize(self) -> int:
        return len(self._items) + self._real.qsize()

    def leftovers(self) -> list[T]:
        return list(self._items)


class LazyBatchQueue(BatchQueue[T]):
    """Fetches everything from the real queue on the first ``get_nowait`` and hands the batch to
    ``on_batch`` (which may pre-compute decisions) before serving it.

    Lazy because the provider fills the result queue (watcher -> results) inside its own ``sync``
    right before draining it.
    """

    def __init__(self, real: Any, on_batch: Callable[[list[T]], None]):
        super().__init__(real, ())
        self._on_batch = on_batch
        self._fetched = False

    def get_nowait(self) -> T:
        if not self._fetched:
            self._fetched = True
            batch = drain(self._real)
            if batch:
                self._on_batch(batch)
            self._items.extend(batch)
        return super().get_nowait()
