"""Run by tests/runner/measurement/test_machine_load.py as two processes of one machine joined by
`TorchProcessGroup` (gloo): each takes the run's load samples together, process 1 spinning its CPU for a second
between them and process 0 idle, and prints as one JSON line how long it spun, its own CPU seconds around the
samples and the `machine_load` section it made of them.

    python tests/machine_load_probe.py RANK COORDINATOR     (COORDINATOR: host:port of process 0)
"""

import json
import os
import sys
import time


def main(rank, coordinator):
    from mtbench.plugins.api import Launch
    from mtbench.plugins.backends.torch_processes import TorchProcessGroup
    from mtbench.runner.measurement.load import machine_load_of_run, own_cpu_seconds, sample_load_together
    launch = Launch(process_id=rank, num_processes=2, local_rank=rank, local_processes=2, coordinator=coordinator,
                    launcher="flags", timeout_s=60)
    processes = TorchProcessGroup(launch)
    own_from = own_cpu_seconds()
    before = sample_load_together(processes, launch.local_processes, None)
    started = time.process_time()
    if rank == 1:
        while time.process_time() - started < 1.0:
            pass
    spun = time.process_time() - started
    section = machine_load_of_run(before, processes, launch, None)
    print(json.dumps({"spun_s": spun, "own_cpu_s": own_cpu_seconds() - own_from, "section": section}))
    processes.close()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(int(sys.argv[1]), sys.argv[2])
