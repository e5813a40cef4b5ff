"""Commands fired at the same instant from several threads, the way two people at two desks fire them."""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Callable

from engine import RailyardError


def together(*calls: Callable[[], object], jitter: float = 0.0) -> list[object]:
    """Run the calls at the same instant (the later ones up to `jitter` s later); each result is its return value
    or its error code."""
    barrier = threading.Barrier(len(calls))
    results: list[object] = [None] * len(calls)

    def run(i: int) -> None:
        barrier.wait()
        if i and jitter:
            time.sleep(random.uniform(0, jitter))
        try:
            results[i] = calls[i]()
        except RailyardError as error:
            results[i] = error.code

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    return results
