"""A torch run's processes leave their group together, and through its store: no collective runs as they go.
gloo's worker thread lets go of a collective after the caller has moved on, taking the GIL to free tensors that
Python made; a process whose interpreter was already shutting down aborted there ("terminate called without an
active exception", exit -6), after a completed run: 4 of 55 2-process DDP runs of a tiny GPT on this project's
machine, while the processes left through a gloo barrier."""

from conftest import run_joined_probes


def test_the_processes_leave_together_running_no_collective():
    first, second = run_joined_probes("torch_processes_probe.py")
    assert first["agreed"] == second["agreed"] == {"any": True, "sum": [3.0, 4.0]}
    for record in (first, second):
        assert record["collectives_at_close"] == 3  # any, sum, barrier
        assert record["collectives_at_destroy"] == record["collectives_at_close"]
    # Process 0 reached close a second before process 1, and waited for it there.
    assert first["closing_at"] < second["closing_at"] <= first["destroyed_at"]
