"""`--profile` on JAX: jax.profiler's trace of the profiled steps, each step named in it ("mtbench train step N"),
as XProf (TensorBoard's profile plugin) and Perfetto read it."""

import gzip
import json
import os

from mtbench.plugins.backends.trace_operations import STEP_NAME, complete_events, names_of, operations_record, works_of

PERFETTO_FILE = "perfetto_trace.json.gz"


class JaxStepProfiler:
    """`Backend.step_profiler` on JAX: the process's host and device activity between `start()` and `stop()`, the
    device's included (XLA's runtime records it on GPUs and TPUs alike)."""

    def __init__(self, directory):
        self.directory = directory
        self.files = []

    def start(self):
        import jax
        # Perfetto's file beside XProf's: one viewer (ui.perfetto.dev) opens both backends' traces.
        jax.profiler.start_trace(self.directory, create_perfetto_trace=True)

    def step(self, number):
        import jax
        # A step annotation, which XProf's step-time view groups the device's work by.
        return jax.profiler.StepTraceAnnotation(f"{STEP_NAME} {number}", step_num=number)

    def stop(self):
        import jax
        jax.profiler.stop_trace()
        self.files = sorted(os.path.join(root, name) for root, _, names in os.walk(self.directory) for name in names)
        return self.files

    def operations(self):
        """A device's kernels where the trace has a device ("/device:GPU:0"'s streams; a TPU's XLA ops), else the XLA
        operations the host ran, each by its own time."""
        path = next((path for path in self.files if os.path.basename(path) == PERFETTO_FILE), None)
        if path is None:
            raise FileNotFoundError(f"jax.profiler wrote no {PERFETTO_FILE}")
        with gzip.open(path, "rt") as file:
            trace = json.load(file)
        events, processes, threads = complete_events(trace), names_of(trace, "process_name"), \
            names_of(trace, "thread_name")
        on_device = [event for event in events if processes.get(event["pid"], "").startswith("/device:")]
        streams = [event for event in on_device
                   if threads.get((event["pid"], event.get("tid")), "").startswith("Stream")]
        xla_ops = [event for event in (on_device or events) if "hlo_op" in event.get("args", {})]
        on, chosen = ("device", streams or xla_ops) if on_device else ("host", xla_ops)
        # Each device is a process of the trace.
        return operations_record(on, works_of(chosen, on_device=bool(on_device)))
