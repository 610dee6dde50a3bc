"""Batches built ahead: the next training batches are assembled in a background thread while the current step
runs, on every backend alike, so that the timed loop only takes a finished batch from a queue."""

import queue
import threading

DEPTH = 2  # batches waiting: enough to hide one slow batch, few enough to hold little memory


class Prefetched:
    """Iterates over `source` (an iterator, run in a background thread) `depth` items ahead. An error raised by
    `source` is raised again by the `next` call that would have returned its item. `close` stops the thread."""

    def __init__(self, source, depth=DEPTH):
        self._queue = queue.Queue(maxsize=depth)
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._fill, args=(source,), name="mtbench-batches", daemon=True)
        self._thread.start()

    def _put(self, entry):
        while not self._closed.is_set():
            try:
                self._queue.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _fill(self, source):
        try:
            for item in source:
                if not self._put(("item", item)):
                    return
        except BaseException as error:  # handed to the consumer, which raises it where the item was wanted
            self._put(("error", error))
            return
        self._put(("end", None))

    def __iter__(self):
        return self

    def __next__(self):
        if self._closed.is_set():
            raise StopIteration
        kind, value = self._queue.get()
        if kind == "item":
            return value
        self._closed.set()
        if kind == "error":
            raise value
        raise StopIteration

    def close(self):
        self._closed.set()
        self._thread.join(timeout=5)
