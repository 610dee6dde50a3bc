"""Run by tests/runner/measurement/test_energy.py as two processes joined through torch.distributed (gloo): each
meters a recorded counter of its own device, process 1's drawing twice what process 0's draws, and prints its
energy section and its history's joules as one JSON line.

    python tests/energy_processes_probe.py RANK COORDINATOR     (COORDINATOR: host:port of process 0)
"""

import itertools
import json
import os
import sys


def main(rank, coordinator):
    from mtbench.plugins.api import Launch
    from mtbench.plugins.backends.torch_processes import TorchProcessGroup
    from mtbench.runner.measurement.energy import Counter, EnergyMeter

    class RecordedCounter(Counter):
        """A counter whose device draws `joules_per_reading` between readings (its start, a step's edges, the
        run's end)."""
        source = "recorded"
        counts = "this process's recorded device only"

        def __init__(self, joules_per_reading):
            self.readings = itertools.count(0.0, joules_per_reading)

        def read(self):
            return [next(self.readings)]

    processes = TorchProcessGroup(Launch(process_id=rank, num_processes=2, coordinator=coordinator,
                                         launcher="flags", timeout_s=60))
    clock = iter([0.0, 10.0])
    meter = EnergyMeter(RecordedCounter(10.0 * (rank + 1)), clock=lambda: next(clock))
    history = [{"step": step, "first_of_shape": step == 1, "tokens": 500, "seconds": 1.0,
                "joules": meter.between(meter.read(), meter.read())} for step in (1, 2, 3)]
    section, history = meter.section(history, processes)
    print(json.dumps({"section": section, "joules": [h["joules"] for h in history]}))
    processes.close()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(int(sys.argv[1]), sys.argv[2])
