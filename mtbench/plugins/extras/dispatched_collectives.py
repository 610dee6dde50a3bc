"""The collectives torch dispatched, read from its profiler: what a step of torch's distributed extras ran over
its process group, counted where it ran (torch's counterpart of `compiled_collectives`, which reads a compiled XLA
program)."""

import collections

from mtbench.plugins.backends.torch_profiler import kineto_lines_left_out


def profiled_collectives(call, once=()):
    """(what `call()` returns, {operation: how often it ran}) of the collectives `call` ran, read from torch's
    profiler: c10d's operations (every collective over a process group, called directly or under a functional
    collective) and the functional collectives (DTensor's, eager or in a compiled graph). An operation dispatched
    again under itself (through a Python dispatch mode) counts once, and a functional one counts where it reached a
    process group; one dispatched under an operation whose name holds a word of `once` (work done once a run, which
    the profiled call happened to do) not at all. The profiler, not DTensor's `CommDebugMode`:
    dynamo does not compile a frame under a dispatch mode, so a mode would count an eager step in place of a
    compiled one."""
    from torch.profiler import ProfilerActivity, profile
    # The Python calls in the trace too where `once` names one: the operations alone do not show it.
    with kineto_lines_left_out(), profile(activities=[ProfilerActivity.CPU], with_stack=bool(once)) as profiled:
        result = call()

    def parents(event):
        parent = event.cpu_parent
        while parent is not None:
            yield parent
            parent = parent.cpu_parent

    def left_out(event):
        return any(parent.name == event.name or any(word in parent.name for word in once)
                   for parent in parents(event))

    def communicates(event):
        """Whether a functional collective reached a process group: one a selective checkpoint serves from what it
        kept (`--remat-policy matmuls`) is dispatched, and recorded, without communicating."""
        return any(child.name.startswith("c10d::") or communicates(child) for child in event.cpu_children)

    return result, collections.Counter(
        event.name for event in profiled.events()
        if (event.name.startswith("c10d::") or event.name.startswith("_c10d_functional::") and communicates(event))
        and not left_out(event))


def collective_kind(op):
    """The kind of collective, or of point-to-point message, a c10d operation's name says ('c10d.allreduce_',
    'c10d_functional.all_reduce', 'c10d::send'); the name itself for another."""
    name = op.replace("_", "")
    return next((kind for kind, word in (("all-gather", "allgather"), ("reduce-scatter", "reducescatter"),
                                         ("all-reduce", "allreduce"), ("broadcast", "broadcast"), ("send", "send"),
                                         ("receive", "recv")) if word in name), op)


def dispatched_counts(ran):
    """{kind: count} of the collectives among `profiled_collectives`' {operation: count} that reached the process
    group (c10d's operations), the kinds in order."""
    kinds = collections.Counter()
    for op, count in ran.items():
        if op.startswith("c10d::"):
            kinds[collective_kind(op)] += count
    return dict(sorted(kinds.items()))


class ProfiledCall:
    """Runs the calls of mtbench's torch `step` it is given, one of them under `profiled_collectives`, for a
    distributed extra to record what one step dispatched: the eager step's first (a warm-up call, timed as
    compilation), the compiled step's first after its warm-up (while it compiles, the traced collectives would count
    too), or the `at_least`th where that is later; `once` as `profiled_collectives` takes it. That call is a warm-up
    step, or the first steady one, which the loop counts host waits in (torch always has the counter) and sets
    aside: the profiler's cost is in neither the compile time nor the steady figures."""

    def __init__(self, step, at_least=1, once=()):
        from mtbench.plugins.backends.torch_compiled_step import CompiledTorchTrainStep
        first = step.warmup_calls + 1 if isinstance(step, CompiledTorchTrainStep) else 1
        self.calls, self.due, self.once = 0, max(first, at_least), once

    def __call__(self, call):
        """(what `call()` returns, {operation: how often it ran} where this is the profiled call, else None)."""
        self.calls += 1
        if self.calls != self.due:
            return call(), None
        return profiled_collectives(call, self.once)
