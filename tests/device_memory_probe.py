"""Run by tests/runner/measurement/test_memory_of_every_process.py as two processes joined through torch.distributed
(gloo), each with a backend that reports its own device as torch's does on a GPU: process 1's (a last pipeline
stage, which holds the logits) peaks higher than process 0's. Each prints what it gathered as one JSON line.

    python tests/device_memory_probe.py RANK COORDINATOR     (COORDINATOR: host:port of process 0)
"""

import json
import os
import sys

MIB = 2 ** 20


class OneGpuEach:
    """torch's device memory on a GPU a process, process `rank` on GPU `rank`."""

    def __init__(self, rank):
        self.rank = rank

    def device_memory(self):
        return [{"device": "NVIDIA H100 80GB HBM3", "index": self.rank, "peak_bytes": (300 + 500 * self.rank) * MIB,
                 "in_use_bytes": 100 * MIB}]

    def peak_device_bytes(self):
        return (400 + 500 * self.rank) * MIB


def main(rank, coordinator):
    from mtbench.plugins.api import Launch
    from mtbench.plugins.backends.torch_processes import TorchProcessGroup
    from mtbench.runner.measurement.device_memory import largest_peak, training_memory
    processes = TorchProcessGroup(Launch(process_id=rank, num_processes=2, coordinator=coordinator,
                                         launcher="flags", timeout_s=60))
    backend = OneGpuEach(rank)
    print(json.dumps({"training": training_memory(backend, processes), "peak": largest_peak(backend, processes)}))
    processes.close()


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(int(sys.argv[1]), sys.argv[2])
