"""Run by tests/plugins/backends/test_torch_processes.py as two processes joined by `TorchProcessGroup` (gloo):
each agrees once of every kind, process 1 reaches `close` a second after process 0, and each prints as one JSON
line what it agreed, the group's collectives counted as it reached `close` and as `close` destroyed the group,
and (wall clock) when it reached `close` and when it destroyed the group.

    python tests/torch_processes_probe.py RANK COORDINATOR     (COORDINATOR: host:port of process 0)
"""

import json
import os
import sys
import time


def main(rank, coordinator):
    import torch.distributed as dist
    from mtbench.plugins.api import Launch
    from mtbench.plugins.backends.torch_processes import TorchProcessGroup
    processes = TorchProcessGroup(Launch(process_id=rank, num_processes=2, coordinator=coordinator,
                                         launcher="flags", timeout_s=60))
    agreed = {"any": processes.any(rank == 1), "sum": processes.sum([rank + 1.0, 2.0])}
    processes.barrier()
    record = {"agreed": agreed}
    destroy = dist.destroy_process_group

    def destroy_recording(*args, **kwargs):
        record["destroyed_at"] = time.time()
        record["collectives_at_destroy"] = dist.group.WORLD._get_sequence_number_for_group()
        destroy(*args, **kwargs)

    dist.destroy_process_group = destroy_recording
    time.sleep(rank * 1.0)
    record["collectives_at_close"] = dist.group.WORLD._get_sequence_number_for_group()
    record["closing_at"] = time.time()
    processes.close()
    print(json.dumps(record))


if __name__ == "__main__":
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    main(int(sys.argv[1]), sys.argv[2])
