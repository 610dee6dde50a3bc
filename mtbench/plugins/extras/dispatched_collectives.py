"""The collectives torch dispatched, read from its profiler: what a step of torch's distributed extras ran over
its process group, counted where it ran (torch's counterpart of `compiled_collectives`, which reads a compiled XLA
program)."""

import collections

from mtbench.plugins.backends.torch_profiler import kineto_lines_left_out

def profiled_collectives(call):
    """(what `call()` returns, {operation: how often it ran}) of the collectives `call` ran, read from torch's
    profiler: c10d's operations (every collective over a process group, called directly or under a functional
    collective) and the functional collectives (DTensor's, eager or in a compiled graph). An operation dispatched
    again under itself (through a Python dispatch mode) counts once, and a functional one counts where it reached a
    process group. The profiler, not DTensor's `CommDebugMode`:
    dynamo does not compile a frame under a dispatch mode, so a mode would count an eager step in place of a
    compiled one."""
    from torch.profiler import ProfilerActivity, profile
    with kineto_lines_left_out(), profile(activities=[ProfilerActivity.CPU]) as profiled:
        result = call()

    def within_itself(event):
        parent = event.cpu_parent
        while parent is not None:
            if parent.name == event.name:
                return True
            parent = parent.cpu_parent
        return False

    def communicates(event):
        """Whether a functional collective reached a process group: one a selective checkpoint serves from what it
        kept (`--remat-policy matmuls`) is dispatched, and recorded, without communicating."""
        return any(child.name.startswith("c10d::") or communicates(child) for child in event.cpu_children)

    return result, collections.Counter(
        event.name for event in profiled.events()
        if (event.name.startswith("c10d::") or event.name.startswith("_c10d_functional::") and communicates(event))
        and not within_itself(event))


def collective_kind(op):
    """The kind of collective, or of point-to-point message, a c10d operation's name says ('c10d.allreduce_',
    'c10d_functional.all_reduce', 'c10d::send'); the name itself for another."""
    name = op.replace("_", "")
    return next((kind for kind, word in (("all-gather", "allgather"), ("reduce-scatter", "reducescatter"),
                                         ("all-reduce", "allreduce"), ("broadcast", "broadcast"), ("send", "send"),
                                         ("receive", "recv")) if word in name), op)
