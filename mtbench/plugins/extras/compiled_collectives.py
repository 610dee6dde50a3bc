"""The collectives of a compiled XLA program, read from its text: what a step really moves between devices, counted
where it ran (each array of a combined collective, a loop's body as often as the loop runs), so that the extras
record what their compiled steps do rather than what they ask for."""

import collections
import re


def hlo_computations(hlo):
    """[(name, whether it is the entry, its instructions' lines)] of a compiled program's text, in the order XLA
    prints them (a computation's callees before it)."""
    computations = []
    for line in hlo.splitlines():
        header = re.match(r"(ENTRY )?%?([\w.\-]+) .*\{$", line)
        if header and not line.startswith((" ", "HloModule")):
            computations.append((header.group(2), header.group(1) is not None, []))
        elif computations and line.startswith(" "):
            computations[-1][2].append(line)
    return computations


def hlo_runs(computations, trip_count=1):
    """{name: how often one run of the program runs it} of `hlo_computations`: the entry once, a while loop's body
    as often as its known trip count says (`trip_count` where XLA does not say), anything else a computation calls
    (`calls=`, `to_apply=`, a loop's condition, `*_computations={...}`) as often as its caller."""
    runs = collections.Counter({name: 1 for name, entry, _ in computations if entry})
    for caller, _, lines in reversed(computations):  # callers after their callees: each total is whole here
        for line in lines:
            trips = re.search(r'known_trip_count"?\s*[:=]\s*\{\s*"?n"?\s*[:=]\s*"?(\d+)', line)
            for key, callee in re.findall(r"\b(body|condition|calls|to_apply)=%([\w.\-]+)", line):
                times = (int(trips.group(1)) if trips else trip_count) if key == "body" else 1
                runs[callee] += runs[caller] * times
            for listed in re.findall(r"_computations=\{([^}]*)\}", line):
                for callee in re.findall(r"%([\w.\-]+)", listed):
                    runs[callee] += runs[caller]
    return runs


class MovedByKind(dict):
    """{kind: [the shape of each array moved]}, with `instructions`: {kind: the collective instructions that moved
    them, each as often as it runs} (XLA combines independent collectives into one instruction of a tuple: the count
    comparable with the collectives a torch step dispatches)."""

    def __init__(self):
        super().__init__()
        self.instructions = collections.Counter()


def hlo_collectives(hlo, trip_count=1):
    """{kind: [the shape of each array it moves, once per time it runs in a run of the program]} of a compiled
    program's text: the arrays of a tuple collective (XLA combines independent ones) counted one by one, a
    collective in a loop's body (the micro-batches of --grad-accum) as often as the loop runs it. An asynchronous
    collective (XLA:GPU's `all-gather-start` and `-done`) is read from its `-done`, whose result is what it moved:
    the `-start`'s tuple also holds its operands (and a permute's context scalars). A `MovedByKind`."""
    found = MovedByKind()
    computations = hlo_computations(hlo)
    runs = hlo_runs(computations, trip_count)
    for name, _, lines in computations:
        for line in lines:
            collective = re.search(r"= (\(.*?\)|\S+) (all-reduce|all-gather|reduce-scatter|all-to-all|"
                                   r"collective-permute)(?:-done)?\(", line)
            if collective:
                shapes = re.findall(r"[a-z0-9]+\[[0-9,]*\]", re.sub(r"\{[0-9,]*\}", "", collective.group(1)))
                found.setdefault(collective.group(2), []).extend(shapes * runs[name])
                found.instructions[collective.group(2)] += runs[name]
    return found


def collective_counts(by_kind):
    """{kind: arrays moved} of `hlo_collectives`'s {kind: [shapes]}, the kinds in order."""
    return {kind: len(shapes) for kind, shapes in sorted(by_kind.items())}


def instruction_counts(by_kind):
    """{kind: collective instructions run} of `hlo_collectives`'s answer, the kinds in order."""
    return {kind: by_kind.instructions[kind] for kind in sorted(by_kind)}


def collectives_counted(by_kind):
    """The record of a step's collectives (`hlo_collectives`'s answer): `collectives_per_step` ({kind: arrays
    moved}) and `collective_instructions_per_step` ({kind: the instructions that moved them})."""
    return {"collectives_per_step": collective_counts(by_kind),
            "collective_instructions_per_step": instruction_counts(by_kind)}
