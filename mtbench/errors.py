"""Errors that end a run with one clear line instead of a traceback."""


class MtbenchError(Exception):
    """A problem the user can fix. Exit code 2 for bad input or usage, 1 for a failure at run time."""

    def __init__(self, message, exit_code=2):
        super().__init__(message)
        self.exit_code = exit_code


class RunFailure(MtbenchError):
    def __init__(self, message):
        super().__init__(message, exit_code=1)


class ReportingFailed(MtbenchError):
    """The run completed and its result is written, but part of its reporting failed: a reporter, a tracker, or
    an extra's `record` (an exit code of its own, so that a comparison goes on with its other runs)."""
    EXIT_CODE = 3

    def __init__(self, message):
        super().__init__(message, exit_code=self.EXIT_CODE)


class RunInterrupted(MtbenchError):
    """Stopped by a signal after saving a checkpoint and a partial result; the exit code is the signal's."""
