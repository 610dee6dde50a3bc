"""torch-compile: Keras's train step on torch compiled with torch.compile, in the mode the user picks.

Graph breaks and recompilations are what make torch.compile slow or fast, so dynamo's counters go into the
result: a graph break or a recompile storm is a figure to show, not hide."""

from mtbench.plugins.api import Extra, KerasTrainStep
from mtbench.plugins.hookspecs import hookimpl


class TorchCompile(Extra):
    name = "torch-compile"
    description = "compile the train step with torch.compile (--compile-mode); reports graphs and graph breaks"
    backends = ("torch",)

    def compile_options(self, run):
        # Keras would call torch.compile itself without a mode; compile the step here instead.
        return {"jit_compile": False}

    def make_train_step(self, run, model):
        import torch
        from torch._dynamo.utils import counters
        counters.clear()
        mode = None if run.config.compile_mode == "default" else run.config.compile_mode
        model.make_train_function()
        model.train_function = torch.compile(model.train_function, mode=mode)
        return KerasTrainStep(model)

    def record(self, run):
        from torch._dynamo.utils import counters
        breaks = dict(counters["graph_break"])
        return {
            "mode": run.config.compile_mode,
            "graphs_compiled": int(counters["stats"]["unique_graphs"]),
            "frames_compiled": int(counters["frames"]["ok"]),
            "graph_breaks": int(sum(breaks.values())),
            "graph_break_reasons": dict(sorted(breaks.items(), key=lambda kv: -kv[1])[:10]),
            "recompilations": int(sum(counters["recompiles"].values())) if "recompiles" in counters else None,
        }


@hookimpl
def mtbench_register_extras(register):
    register(TorchCompile())
