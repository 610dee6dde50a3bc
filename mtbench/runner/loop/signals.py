"""Ctrl-C and SIGTERM during training: the step under way finishes, then the run stops cleanly (a checkpoint and
a partial result). A second Ctrl-C stops at once, for when even that takes too long. After training (evaluation,
the saved model) either stops what runs at once, and the run keeps its training's figures (`Stopped`)."""

import _thread
import contextlib
import gc
import signal
import sys
import threading
import time

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
            raise StoppedAtOnce(f"{self.name} received, then SIGINT: stopped at once")
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
    with _handlers(requests._handle):
        yield requests


@contextlib.contextmanager
def _handlers(handler, signums=tuple(EXIT_CODES)):
    """`handler` for `signums` (SIGINT and SIGTERM) in the block, the previous ones back afterwards, each of them
    whatever a signal raises meanwhile: `signal.signal` runs the handlers of signals already come before it changes
    one, so a Ctrl-C may raise out of installing or putting back the other's."""
    previous = {}
    try:
        for signum in signums:
            previous[signum] = signal.signal(signum, handler)
        yield
    finally:
        raised = None
        for signum, handler in previous.items():
            for attempt in range(2):  # a signal's handler raising comes once: a second failure is no signal's
                try:
                    signal.signal(signum, handler)
                    break
                except BaseException as error:  # not put back: tried again, and raised once all are
                    raised = raised or error
        if raised is not None:
            raise raised


class StoppedAtOnce(KeyboardInterrupt):
    """A second Ctrl-C while training stops: the run ends where it is (`training.stopped_at_once` says what its
    files keep)."""

    exit_code = EXIT_CODES[signal.SIGINT]


class Stopped(BaseException):
    """SIGINT or SIGTERM received where the work under way is cut short (`stop_at_once`). Not an Exception, as
    KeyboardInterrupt is not: a plugin's failure is caught as one, and this is none."""

    def __init__(self, signum, deferred=False):
        super().__init__(signal.Signals(signum).name)
        self.name, self.exit_code = signal.Signals(signum).name, EXIT_CODES[signum]
        # Raised at the end of `stop_at_once`'s block: where the signal came, Python swallowed the Stopped.
        self.deferred = deferred


RESEND_DELAY_S = 0.001  # before a signal taken where Python swallows what it raises is sent again


def _inside_a_swallower(frame):
    """Whether the frame runs inside a garbage collector's callback (JAX frees device buffers in one), a `__del__`
    or the unraisable hook (which may itself start the thread that sends a swallowed signal again, and on a busy
    machine take it before returning): Python prints an exception raised there and drops it, and the callback's
    own work is cut short."""
    callbacks = {getattr(callback, "__code__", None) for callback in [*gc.callbacks, sys.unraisablehook]}
    while frame is not None:
        if frame.f_code in callbacks or frame.f_code.co_name == "__del__":
            return True
        frame = frame.f_back
    return False


@contextlib.contextmanager
def stop_at_once(signums=tuple(EXIT_CODES)):
    """In the block, SIGINT and SIGTERM (those of `signums`) raise Stopped (SIGTERM would end the process with
    nothing written, Ctrl-C anywhere with a KeyboardInterrupt); the previous handlers come back afterwards. Outside
    the main thread nothing is installed. A signal taken inside a garbage collector's callback or a `__del__` is
    sent again from a thread until it comes outside them (as Python's flag, not the system's signal: a wait in the
    main thread is not cut short, and ends before the stop). A Stopped Python swallows all the same (a weak
    reference's callback, where nothing on the stack says so; JAX frees arrays in them) is not printed and is sent
    again likewise, the work it cut short lost; where the block ends first, its end stops: `deferred`."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    received, ending, lock = [], [], threading.Lock()

    def send_again(signum):
        time.sleep(RESEND_DELAY_S)  # the callback's own work goes on meanwhile
        with lock:
            if not ending:
                _thread.interrupt_main(signum)  # as if the signal came again, to the main thread

    def stop(signum, frame):
        received.append(signum)
        if ending:  # sent again as the block ended: the end raises it
            return
        if _inside_a_swallower(frame):
            threading.Thread(target=send_again, args=(signum,), daemon=True).start()
            return
        raise Stopped(signum)

    previous_hook = sys.unraisablehook

    def unraisable(hook_args):
        if isinstance(hook_args.exc_value, Stopped):  # dropped where `_inside_a_swallower` could not tell
            signum = signal.Signals[hook_args.exc_value.name]
            threading.Thread(target=send_again, args=(signum,), daemon=True).start()
        else:
            previous_hook(hook_args)
    sys.unraisablehook = unraisable
    try:
        with _handlers(stop, signums):
            try:
                yield
            finally:
                ending.append(True)
                with lock:  # a thread sending a signal again has sent it, or will not
                    pass
    finally:
        sys.unraisablehook = previous_hook
    if received:  # the block ended without the Stopped its signal raised
        raise Stopped(received[0], deferred=True)
