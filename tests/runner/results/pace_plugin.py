"""A test plugin (installed by `pace_plugin_path` in test_verdicts_runs.py as the package `mtbench-pace`): two
extras that wrap the backend's train step. `same-step` changes nothing, so a run with it is the same computation as
one without (an A/A with another label); `slow-step` sleeps a fixed time before every step, so a run with it is
slower by a known amount."""

import time

from mtbench import Extra, WrappingStep, hookimpl

SLEEP_S = 0.15  # per step: far above a tiny model's step on a CPU (15 ms on a quiet machine, 60 ms on a busy one)


class SleepingStep(WrappingStep):
    def __init__(self, inner, seconds):
        super().__init__(inner)
        self.seconds = seconds

    def __call__(self, x, y, sample_weight):
        if self.seconds:
            time.sleep(self.seconds)
        return self.inner(x, y, sample_weight)


class Pace(Extra):
    backends = ("jax", "torch")

    def __init__(self, name, seconds):
        self.name, self.seconds = name, seconds
        self.description = f"sleeps {seconds * 1000:g} ms before every train step" if seconds else \
            "wraps the train step and changes nothing"

    def make_train_step(self, run, model, step):
        return SleepingStep(step, self.seconds)


@hookimpl
def mtbench_register_extras(register):
    register(Pace("same-step", 0.0))
    register(Pace("slow-step", SLEEP_S))
