"""`--profile` on torch: torch.profiler's trace of the profiled steps, each step named in it ("mtbench train step
N"), as a Chrome trace (Perfetto and chrome://tracing read it)."""

import os

STEP_NAME = "mtbench train step"
TRACE_FILE = "trace.json"


class TorchStepProfiler:
    """`Backend.step_profiler` on torch: the operators the host dispatched between `start()` and `stop()` with their
    shapes, and the kernels of a CUDA (or ROCm) device where torch has one."""

    def __init__(self, directory):
        self.directory = directory
        self.profile = None

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
        path = os.path.join(self.directory, TRACE_FILE)
        self.profile.export_chrome_trace(path)
        return [path]
