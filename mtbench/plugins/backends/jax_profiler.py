"""`--profile` on JAX: jax.profiler's trace of the profiled steps, each step named in it ("mtbench train step N"),
as XProf (TensorBoard's profile plugin) and Perfetto read it."""

import os

STEP_NAME = "mtbench train step"


class JaxStepProfiler:
    """`Backend.step_profiler` on JAX: the process's host and device activity between `start()` and `stop()`, the
    device's included (XLA's runtime records it on GPUs and TPUs alike)."""

    def __init__(self, directory):
        self.directory = directory

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
        return sorted(os.path.join(root, name) for root, _, names in os.walk(self.directory) for name in names)
