"""Ctrl-C and SIGTERM during training: the step under way finishes, then the run stops cleanly (a checkpoint and
a partial result). A second Ctrl-C stops at once, for when even that takes too long. After training (evaluation,
the saved model) either stops what runs at once, and the run keeps its training's figures (`Stopped`)."""

import contextlib
import signal
import threading

# The shell's convention: 128 + the signal number.
EXIT_CODES = {signal.SIGINT: 130, signal.SIGTERM: 143}


class StopRequests:
    def __init__(self):
        self.received = None  # the first signal received, or None

    @property
    def requested(self):
        return self.received is not None

    @property
    def name(self):
        return signal.Signals(self.received).name

    @property
    def exit_code(self):
        return EXIT_CODES[self.received]

    def agree(self, processes):
        """Of several processes (a ProcessGroup), a signal any one received stops them all after the same step;
        one that received none stops as if it had received SIGTERM."""
        if processes.any(self.requested) and self.received is None:
            self.received = signal.SIGTERM
        return self.requested

    def _handle(self, signum, frame):
        if self.received is not None and signum == signal.SIGINT:
            raise KeyboardInterrupt
        if self.received is None:
            self.received = signum


@contextlib.contextmanager
def stop_requests():
    """Yields a StopRequests that records SIGINT/SIGTERM while the block runs; the previous handlers come back
    afterwards. Outside the main thread (where Python cannot take signals) nothing is installed."""
    requests = StopRequests()
    if threading.current_thread() is not threading.main_thread():
        yield requests
        return
    previous = {signum: signal.signal(signum, requests._handle) for signum in EXIT_CODES}
    try:
        yield requests
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


class Stopped(BaseException):
    """SIGINT or SIGTERM received where the work under way is cut short (`stop_at_once`). Not an Exception, as
    KeyboardInterrupt is not: a plugin's failure is caught as one, and this is none."""

    def __init__(self, signum, deferred=False):
        super().__init__(signal.Signals(signum).name)
        self.name, self.exit_code = signal.Signals(signum).name, EXIT_CODES[signum]
        # Raised at the end of `stop_at_once`'s block: where the signal came, Python swallowed the Stopped.
        self.deferred = deferred


@contextlib.contextmanager
def stop_at_once():
    """In the block, SIGINT and SIGTERM raise Stopped (SIGTERM would end the process with nothing written, Ctrl-C
    anywhere with a KeyboardInterrupt); the previous handlers come back afterwards. Outside the main thread nothing
    is installed. A Stopped raised where Python swallows exceptions (a signal taken inside a garbage collector's
    callback, such as JAX's, or a `__del__`: "Exception ignored in ...", and the work goes on) still stops: at the
    block's end, `deferred`."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received = []

    def stop(signum, frame):
        received.append(signum)
        raise Stopped(signum)
    previous = {signum: signal.signal(signum, stop) for signum in EXIT_CODES}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)
    if received:  # the block ended without the Stopped its signal raised
        raise Stopped(received[0], deferred=True)
