"""A child process's log, written as it runs: its stdout goes straight into the log file (so `tail -f` follows
a run of `compare` or `rerun`), and a thread hands each training line it writes (`step ...`, `validation at
...`, a sample) to the parent, which shows it beside the run's name."""

import re
import threading

# The lines a training run writes off a terminal (`runner.loop.progress`): steps, validations and their samples.
TRAINING_LINE = re.compile(r"^(step \d+/\d+ |validation at step |sample: )")
POLL_SECONDS = 0.5


class LogFollower:
    """Reads `path` from `offset` every POLL_SECONDS while the child runs and calls `show(line)` for each new
    complete training line; `stop()` reads what is left, so no line written before the child ended is lost."""

    def __init__(self, path, offset, show):
        self.path, self.offset, self.show = path, offset, show
        self._pending = ""
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._follow, daemon=True)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *_):
        self._stopped.set()
        self._thread.join()
        self._read()

    def _follow(self):
        while not self._stopped.wait(POLL_SECONDS):
            self._read()

    def _read(self):
        with open(self.path, encoding="utf-8", errors="replace") as log:
            log.seek(self.offset)
            text = log.read()
            self.offset = log.tell()
        *lines, self._pending = (self._pending + text).split("\n")
        for line in lines:
            if TRAINING_LINE.match(line):
                self.show(line)
