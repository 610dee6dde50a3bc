"""Counts the host waits inside JAX train steps, as `torch_host_syncs` counts torch's (issue 29): implicit
transfers between the host and the devices, and device values read on the host.

JAX's transfer guard sees every implicit transfer (a NumPy array or Python number handed to a jitted function or
an operation, a value read back on a GPU); in its 'log' mode it writes one line per transfer to the process's
standard error, from C++. The counter runs a step under `jax.transfer_guard('log')`, reads those lines back from
the file descriptor (what else was written there meanwhile is passed on), and exempts the step's own batch
arrays, which every step hands to its jitted function once (matched by shape and dtype, or, as the guard logs a
jitted function's arguments without naming them, by their number). The guard sees no read
on the CPU, where an array's memory is the host's: reads (`float`, `bool`, `item`, `np.asarray`: a jax.Array's
`_value`) are counted where they happen, on every platform. Logging that hides warnings
(`TF_CPP_MIN_LOG_LEVEL` above 0) hides the guard's lines too: the counter checks that it can see one before it
counts, and `per_step()` is None where it cannot. A step that shows its program (`lowered_program`) has the
conditionals in it that branch as it runs counted too, and its loops that end on a value it computes: on a GPU
each reads its predicate on the host and waits for the device.
"""

import collections
import contextlib
import os
import re
import tempfile

# Branches in a StableHLO program: XLA's GPU conditional thunk reads the branch index on the host, unless the index
# is known when XLA compiles (`jax.lax.platform_dependent` picks the platform's branch with a case on a constant).
IF = re.compile(r"\bstablehlo\.if\b")
CASE = re.compile(r'(%[\w#]+)(?::\d+)? = "stablehlo\.case"\((%[\w#]+)\)')
CONSTANT_INDEX = re.compile(r"(%[\w#]+) = stablehlo\.constant dense<-?\d+> : tensor<i32>")
# A loop's condition: XLA's GPU while thunk reads it on the host at every iteration, unless XLA knows the trip count
# when it compiles, as it does for a count against a constant (`fori_loop` and `scan` of a static length).
LOOP_CONDITION = re.compile(r"stablehlo\.while\(.*?\bcond \{\n(.*?)\n\s*\} do \{", re.DOTALL)
COUNTED_CONDITION_LINE = re.compile(
    r"\s*(?:%c\w* = stablehlo\.constant dense<-?\d+> : tensor<[iu]\d+>"
    r"|%\w+ = stablehlo\.compare (?:LT|LE|GT|GE|NE), %iterArg\w*, %c\w*, (?:UN)?SIGNED : .*"
    r"|stablehlo\.return %\w+ : tensor<i1>)\s*")
WEAK_TYPE = re.compile(r",\s*weak_type=\w+")
# The guard's line; a jitted function's arguments are logged without their aval (empty).
TRANSFER_LINE = re.compile(r"(host-to-device|device-to-host|device-to-device) transfer:(?: aval=ShapedArray\(([^)]*)\))?")


def runtime_conditionals(program):
    """How many conditionals of a StableHLO program pick their branch as it runs: every `if`, and every `case` on
    an index that is neither a constant nor the result of a case on one (each function read on its own)."""
    count = 0
    for function in program.split("func.func ")[1:]:
        known = set(CONSTANT_INDEX.findall(function))
        count += len(IF.findall(function))
        for result, index in CASE.findall(function):
            if index in known:
                known.add(result)
            else:
                count += 1
    return count


def runtime_loops(program):
    """How many loops of a StableHLO program end on a value computed as it runs: every `while` whose condition is
    not its counter against a constant (the form JAX gives `fori_loop` and `scan` of a static length)."""
    return sum(1 for condition in LOOP_CONDITION.findall(program)
               if not all(COUNTED_CONDITION_LINE.fullmatch(line) for line in condition.splitlines()))


@contextlib.contextmanager
def _standard_error_captured():
    """Everything written to file descriptor 2 inside, as the text the context yields (a list holding it once
    the context exits); the text is written on to the real standard error too."""
    import sys
    sys.stderr.flush()
    captured = []
    with tempfile.TemporaryFile() as scratch:
        saved = os.dup(2)
        os.dup2(scratch.fileno(), 2)
        try:
            yield captured
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            scratch.seek(0)
            text = scratch.read().decode(errors="replace")
            captured.append(text)
            if text:
                lines = [line for line in text.splitlines(keepends=True) if not TRANSFER_LINE.search(line)]
                os.write(2, "".join(lines).encode())


def guarded_transfers(text):
    """[(kind, aval)] of the transfer guard's lines in `text`, each aval as `_aval` names an array ('int32[64,32]',
    without ', weak_type=True'; '' where the guard names none)."""
    return [(kind, WEAK_TYPE.sub("", aval)) for kind, aval in TRANSFER_LINE.findall(text)]


def _aval(array, processes=1):
    """How the guard names an array's aval: 'int32[4,16]'; `processes`: the global array of that many processes'
    rows."""
    import numpy as np
    array = np.asarray(array)
    shape = (array.shape[0] * processes, *array.shape[1:]) if array.ndim else ()
    return f"{array.dtype}[{','.join(map(str, shape))}]"


class JaxHostSyncCounter:
    """`count_step(step, x, y, w)` runs one train step counting its host waits; `syncs`, `steps`, `events`
    ({'kind aval at ...': count}) and `per_step()` as `TorchHostSyncCounter`'s."""

    def __init__(self):
        self.syncs = 0
        self.steps = 0
        self.events = collections.Counter()
        self.can_count = self._guard_lines_visible()

    @staticmethod
    def _guard_lines_visible():
        import jax
        import numpy as np
        with _standard_error_captured() as text, jax.transfer_guard("log"):
            jax.numpy.asarray(np.zeros(1, np.float32)) + 0
        return bool(TRANSFER_LINE.search(text[0]))

    @contextlib.contextmanager
    def _reads_counted(self):
        """Counts reads of device values on the host while inside (a jax.Array's `_value`, which `float`,
        `bool`, `item`, `tolist` and `np.asarray` go through)."""
        from jax._src.array import ArrayImpl
        value = ArrayImpl._value

        def counted(array):
            if array._npy_value is None:  # a copy from the device, not a value read before
                self.syncs += 1
                self.events[f"read {array.dtype}{list(array.shape)}"] += 1
            return value.fget(array)

        ArrayImpl._value = property(counted)
        try:
            yield
        finally:
            ArrayImpl._value = value

    def count_step(self, step, x, y, sample_weight):
        """Runs `step(x, y, sample_weight)` counting its host waits; returns what the step returns."""
        import jax
        # Each batch array by the names the guard may give it: this process's rows, or under jax.distributed
        # the global array the processes' rows make.
        batch = [{_aval(a), _aval(a, jax.process_count())} for a in (*x, y, sample_weight)]
        with _standard_error_captured() as text, jax.transfer_guard("log"), self._reads_counted():
            logs = step(x, y, sample_weight)
        for kind, aval in guarded_transfers(text[0]):
            if kind == "device-to-host":
                continue  # counted as a read where it happened
            named = next((names for names in batch if not aval or aval in names), None)
            if kind == "host-to-device" and named is not None:
                batch.remove(named)  # the batch's own arrays, handed to the step once
                continue
            self.syncs += 1
            self.events[f"{kind} {aval or 'of an argument'}"] += 1
        self._count_conditionals(step, x, y, sample_weight)
        self.steps += 1
        return logs

    def _count_conditionals(self, step, x, y, sample_weight):
        """The conditionals and the loops of the step's program (`lowered_program`, on the step or a step it
        wraps) that decide as it runs: on a GPU XLA copies each one's predicate to the host and waits for the
        device before it picks a branch or goes round again, a wait the transfer guard cannot see. Counted as host
        waits on accelerators (a loop once, the least it waits: its iterations are not known), named as events
        everywhere."""
        import jax
        inner = step
        while not hasattr(inner, "lowered_program") and hasattr(inner, "inner"):
            inner = inner.inner
        if not hasattr(inner, "lowered_program"):
            return
        program = inner.lowered_program(x, y, sample_weight)
        decisions = {"conditional in the compiled step (a host wait on a GPU)": runtime_conditionals(program),
                     "loop in the compiled step that ends on a computed value (a host wait an iteration on a GPU)":
                         runtime_loops(program)}
        for event, found in decisions.items():
            if found:
                self.events[event] += found
                if jax.default_backend() != "cpu":
                    self.syncs += found

    def per_step(self):
        """Host waits per counted step (None before any, or where the guard's lines cannot be seen)."""
        return self.syncs / self.steps if self.steps and self.can_count else None
