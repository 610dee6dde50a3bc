"""A torch run's processes leave their group together, and through its store: no collective runs as they go.
gloo's worker thread lets go of a collective after the caller has moved on, taking the GIL to free tensors that
Python made; a process whose interpreter was already shutting down aborted there ("terminate called without an
active exception", exit -6), after a completed run: 4 of 55 2-process DDP runs of a tiny GPT on this project's
machine, while the processes left through a gloo barrier."""

import json
import os
import socket
import subprocess
import sys

from conftest import TESTS_DIR, cli_environment


def test_the_processes_leave_together_running_no_collective():
    with socket.socket() as free:
        free.bind(("127.0.0.1", 0))
        coordinator = f"127.0.0.1:{free.getsockname()[1]}"
    probe = os.path.join(TESTS_DIR, "torch_processes_probe.py")
    started = [subprocess.Popen([sys.executable, probe, str(rank), coordinator], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=cli_environment()) for rank in (0, 1)]
    outputs = [process.communicate(timeout=120) for process in started]
    assert [process.returncode for process in started] == [0, 0], outputs[0][1][-2000:] + outputs[1][1][-2000:]
    first, second = (json.loads(stdout.strip().splitlines()[-1]) for stdout, _ in outputs)
    assert first["agreed"] == second["agreed"] == {"any": True, "sum": [3.0, 4.0]}
    for record in (first, second):
        assert record["collectives_at_close"] == 3  # any, sum, barrier
        assert record["collectives_at_destroy"] == record["collectives_at_close"]
    # Process 0 reached close a second before process 1, and waited for it there.
    assert first["closing_at"] < second["closing_at"] <= first["destroyed_at"]
