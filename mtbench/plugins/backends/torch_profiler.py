"""`--profile` on torch: torch.profiler's trace of the profiled steps, each step named in it ("mtbench train step
N"), as a Chrome trace (Perfetto and chrome://tracing read it); and the profiler's start and stop lines left out
of a run's output where it counts what ran (`kineto_lines_left_out`)."""

import contextlib
import json
import os
import sys
import tempfile

from mtbench.plugins.backends.trace_operations import STEP_NAME, complete_events, operations_record, works_of

TRACE_FILE = "trace.json"
DEVICE_CATEGORIES = {"kernel", "gpu_memcpy", "gpu_memset"}   # what a CUDA or ROCm device ran, by Kineto's names

# The lines torch's profiler (Kineto) writes to stderr as it starts and stops, on every process of a run: its own
# bookkeeping, which KINETO_LOG_LEVEL hides only with its errors.
KINETO_LINES = (b"USDT:", b"STAGE:")


@contextlib.contextmanager
def kineto_lines_left_out():
    """Standard error (the file descriptor, which C++ writes to) into a file while the block runs, then written
    back without Kineto's lines (`KINETO_LINES`): what else the block wrote, Python's or C++'s, stays, in its
    order."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as caught:
        os.dup2(caught.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            caught.seek(0)
            os.write(2, b"".join(line for line in caught.read().splitlines(keepends=True)
                                 if not line.startswith(KINETO_LINES)))


class TorchStepProfiler:
    """`Backend.step_profiler` on torch: the operators the host dispatched between `start()` and `stop()` with their
    shapes, and the kernels of a CUDA (or ROCm) device where torch has one."""

    def __init__(self, directory):
        self.directory = directory
        self.profile = None
        self.path = os.path.join(directory, TRACE_FILE)

    def start(self):
        import torch
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        self.profile = torch.profiler.profile(activities=activities, record_shapes=True)
        self.profile.__enter__()

    def step(self, number):
        import torch
        return torch.profiler.record_function(f"{STEP_NAME} {number}")

    def stop(self):
        self.profile.__exit__(None, None, None)
        os.makedirs(self.directory, exist_ok=True)
        self.profile.export_chrome_trace(self.path)
        return [self.path]

    def operations(self):
        """The device's kernels, copies and fills where the trace has them, else the operators the host ran
        (`aten::mm`...), each by its own time."""
        with open(self.path) as file:
            events = complete_events(json.load(file))
        device = [event for event in events if event.get("cat") in DEVICE_CATEGORIES]
        on, chosen = ("device", device) if device else \
            ("host", [event for event in events if event.get("cat") == "cpu_op"])
        # A device's events carry its index as their process.
        return operations_record(on, works_of(chosen, on_device=bool(device)))
