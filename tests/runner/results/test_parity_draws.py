"""compare's parity check with dropout: which runs draw the same masks, and so are held to one curve."""

import numpy as np

from mtbench.figures import run_dtype
from mtbench.runner.results.parity import check_parity


def dropout_run(losses, extras=(), keeping=(), processes=1, spanned_by=(), tensor_parallel_size=None):
    return {"history": [{"step": i, "loss": loss} for i, loss in enumerate(losses, start=1)],
            "model": {"dtype_policy": "float32", "dropout": 0.1},
            "config": {"dtype": "float32", "tensor_parallel_size": tensor_parallel_size},
            "backend": "torch", "train_step": "torch-eager", "extras": list(extras),
            "extras_keeping_draws": list(keeping),
            "processes": {"world_size": processes, "spanned_by": list(spanned_by)}}


def test_processes_joined_by_an_extra_that_keeps_every_draw_are_held_to_one_process():
    """tensor-parallel's processes over one model axis draw one process's masks: held to its curve; ddp's each draw
    their own, and a data axis (--tensor-parallel-size below the processes) its rows' own: held to nothing."""
    losses = list(np.linspace(7.5, 5.0, 20))
    runs = [("torch", dropout_run(losses)),
            ("torch+tensor-parallel@2", dropout_run(losses, ["tensor-parallel"], ["tensor-parallel"], 2,
                                                    ["tensor-parallel"])),
            ("torch+ddp@2", dropout_run(losses, ["ddp"], [], 2, ["ddp"])),
            ("torch+tensor-parallel@4:tensor-parallel-size=2",
             dropout_run(losses, ["tensor-parallel"], ["tensor-parallel"], 4, ["tensor-parallel"], 2))]
    report = check_parity(runs, run_dtype, steps=20, tolerance=0.01)
    assert [(pair.reference, pair.run) for pair in report.pairs] == [("torch", "torch+tensor-parallel@2")]
    assert sorted(name for name, _ in report.unchecked) == ["torch", "torch+ddp@2",
                                                           "torch+tensor-parallel@4:tensor-parallel-size=2"]
