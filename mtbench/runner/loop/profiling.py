"""`--profile N`: N steady steps under the backend's own profiler (`Backend.step_profiler`), in a timing window of
their own after the host-wait probe's step. Their time is set aside, as the probe's is: a profiler slows the steps
it records, differently on each backend, so they count in neither the steady figures nor the training time. One
trace a run (of each process), under RESULT.run/profile."""

import os


class StepProfiling:
    def __init__(self, backend, wanted_steps, run_dir, processes):
        self.backend, self.wanted_steps, self.run_dir, self.processes = backend, wanted_steps, run_dir, processes
        self.profiler = None
        self.directory = None
        self.steps = []   # the steps profiled
        self.files = []   # the trace's files, relative to `directory`
        self.operations = None   # where the steps' time went, from the trace (`step_profiler`'s `operations()`)
        self.operations_why_not = None
        self.done = False

    @property
    def running(self):
        return self.profiler is not None

    def due(self):
        """Whether the next steady step is profiled: until the trace has its steps, or its window ended."""
        return bool(self.wanted_steps) and not self.done

    def start(self, step):
        folder = os.path.join(os.path.abspath(self.run_dir.path), "profile", f"from-step-{step}")
        if self.processes.world_size > 1:
            folder = os.path.join(folder, f"process-{self.processes.rank}")
        os.makedirs(folder, exist_ok=True)
        self.directory = folder
        self.profiler = self.backend.step_profiler(folder)
        self.profiler.start()

    def step(self, number):
        """The context one profiled step runs in, named in the trace."""
        self.steps.append(number)
        return self.profiler.step(number)

    def has_all_steps(self):
        return self.running and len(self.steps) >= self.wanted_steps

    def stop(self, window_s):
        """Ends the trace once its window is closed (the device synchronised: its work is in the trace), and reads
        from it where the window's `window_s` seconds went."""
        self.files = sorted(os.path.relpath(path, self.directory) for path in self.profiler.stop())
        self.operations, self.operations_why_not = operations_of(self.profiler, window_s)
        self.profiler, self.done = None, True

    def record(self):
        """The result's `profile`: the steps profiled and the trace's files; None without --profile."""
        if not self.wanted_steps:
            return None
        if not self.steps:
            return {"asked": self.wanted_steps, "steps": [], "directory": None, "files": [],
                    "why_not": "no steady step was left to profile (each step warmed a shape up or was the "
                               "host-wait probe's)"}
        record = {"asked": self.wanted_steps, "steps": self.steps, "directory": self.directory, "files": self.files}
        # Every process reads its own trace; each process's busy time joins process 0's reading, as one process's
        # devices each count in a reading of several (JAX's one process for all of a machine's GPUs).
        every_busy_s = busy_of_every_process(self.operations, self.processes) if self.processes.world_size > 1 \
            else None
        if self.operations:
            record["operations"] = {**self.operations, **({"processes_busy_s": every_busy_s} if every_busy_s else {})}
        else:
            record["operations_why_not"] = self.operations_why_not
        return record


def busy_of_every_process(operations, processes):
    """Each process's busy time in its profiled window (the mean over its devices), by rank, None where its trace was
    not read: a sum over the processes of lists in which each fills its own place. Every process calls it at the
    same point (the end of training)."""
    world = processes.world_size
    own = [0.0] * (2 * world)
    if operations:
        own[processes.rank], own[world + processes.rank] = operations["busy_s"], 1.0
    every = processes.sum(own)
    return [every[rank] if every[world + rank] else None for rank in range(world)]


def operations_of(profiler, window_s):
    """(the record of where the profiled window's time went, None) or (None, why not). A trace the profiler cannot
    read is said, not raised: the steps trained and their trace is on disk."""
    if not hasattr(profiler, "operations"):
        return None, "this backend's profiler does not read its trace (open it in ui.perfetto.dev)"
    try:
        operations = profiler.operations()
    except Exception as error:  # noqa: BLE001 - a third-party profiler's failure, kept as a reason
        return None, f"its trace could not be read: {type(error).__name__}: {error}"
    if operations is None:
        return None, "the trace holds no operation"
    return {**operations, "window_s": window_s, "busy_share": operations["busy_s"] / window_s if window_s else None},\
        None
