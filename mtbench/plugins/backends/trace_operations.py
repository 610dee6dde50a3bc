"""Where the profiled steps' time went, read from their trace: each operation's own time (the operations it called
left out) summed by name, and the time anything ran at all. Both profilers write Chrome's trace-event format (torch's
`trace.json`, JAX's `perfetto_trace.json.gz`); each chooses the events that are work, on the device's lanes where the
trace has them (a GPU's kernels), else on the host's (the operators a CPU ran)."""

import collections
import re
from dataclasses import dataclass

TOP = 10   # the operations a result keeps, longest first
STEP_NAME = "mtbench train step"   # each profiled step's name in the trace, followed by its number, on both backends

# A device's kernels by what they compute, told by name: the libraries' names are the same under either framework
# (cuBLAS's `nvjet_*` and `sm90_xmma_gemm_*`, CUTLASS's, FlashAttention's `flash_fwd_*`, cuDNN's `*_sdpa_*`, NCCL's
# `ncclDevKernel_*`), and each compiler names the matmuls it generates (XLA `gemm_fusion_<dot>`, inductor
# `triton_tem_fused_mm_N`; a TPU's XLA ops `dot.N` and `convolution.N`). The first kind whose pattern a name
# matches; a kernel no pattern knows (elementwise and reduction fusions, norms, the optimizer) is "other". Inductor
# names its pointwise and reduction kernels after the operators they came from, so one that prepares attention's
# inputs or adds a matmul's bias (`triton_poi_fused__scaled_dot_product_flash_attention_0`) is still "other".
OTHER_KIND = "other"
KERNEL_KINDS = (
    (OTHER_KIND, re.compile(r"^triton_(poi|red|per)_")),
    ("collective", re.compile(r"nccl|rccl|all-?reduce|all-?gather|reduce-?scatter|collective-permute|all-to-all",
                              re.IGNORECASE)),
    ("memory", re.compile(r"memcpy|memset", re.IGNORECASE)),
    ("attention", re.compile(r"flash|fmha|sdpa|attention", re.IGNORECASE)),
    ("matmul", re.compile(r"gemm|gemv|xmma|nvjet|cutlass|cublas|matmul|^dot([._]|$)|^convolution"
                          r"|(^|_)(add|b|badd)?mm(_|\d|$)", re.IGNORECASE)),
)


@dataclass(frozen=True)
class Work:
    unit: object     # what ran it: a device (its busy time is its own), or the host
    lane: object     # where on it (a thread, a stream): events on one lane nest, lanes run at once
    name: str
    start_us: float
    duration_us: float


def operations_record(on, works, top=TOP):
    """`on` ("device" or "host") and the events chosen as work -> the profile's `operations`: `busy_s` (the time a
    unit ran anything, the mean over the `units`: the devices, or the host), `total_s` (the operations' own times
    summed; above `busy_s` where lanes overlap or units are several) and the longest `top` operations with their
    calls and share of `total_s`. On a device, each top operation's `kind` and the `kinds` of all of them, each with
    its seconds and share of `total_s` (`kernel_kind`; a host's operators are not sorted: JAX's CPU fusions hold
    matmuls under names that do not say so). None when no event was work."""
    if not works:
        return None
    own_us, calls = collections.Counter(), collections.Counter()
    by_lane, by_unit = collections.defaultdict(list), collections.defaultdict(list)
    for work in works:
        by_lane[work.unit, work.lane].append(work)
        by_unit[work.unit].append(work)
    for lane_works in by_lane.values():
        for work, own in own_times(lane_works):
            own_us[work.name] += own
            calls[work.name] += 1
    total_us = sum(own_us.values())
    share = (lambda us: us / total_us) if total_us else (lambda us: 0.0)
    record = {"on": on, "units": len(by_unit),
              "busy_s": sum(busy_us(unit_works) for unit_works in by_unit.values()) / len(by_unit) / 1e6,
              "total_s": total_us / 1e6,
              "top": [{"name": name, "seconds": seconds / 1e6, "calls": calls[name], "share": share(seconds)}
                      for name, seconds in own_us.most_common(top)]}
    if on == "device":
        kind_of = {name: kernel_kind(name) for name in own_us}
        kind_us = collections.Counter()
        for name, seconds in own_us.items():
            kind_us[kind_of[name]] += seconds
        for entry in record["top"]:
            entry["kind"] = kind_of[entry["name"]]
        record["kinds"] = [{"kind": kind, "seconds": seconds / 1e6, "share": share(seconds)}
                           for kind, seconds in kind_us.most_common()]
    return record


def works_of(events, on_device):
    """Trace events as `Work`: on a device, each event's process is its unit (a device); the host's threads are one
    unit. Each (process, thread) is a lane."""
    return [Work(event["pid"] if on_device else "host", (event["pid"], event.get("tid")), event["name"], event["ts"],
                 event["dur"]) for event in events]


def kernel_kind(name):
    """What a device's kernel computes, by its name (`KERNEL_KINDS`): matmul, attention, collective, memory or
    other."""
    return next((kind for kind, pattern in KERNEL_KINDS if pattern.search(name)), OTHER_KIND)


def own_times(lane_works):
    """Each event of one lane with its own time: its duration less that of the events it encloses."""
    ordered = sorted(lane_works, key=lambda work: (work.start_us, -work.duration_us))
    own = {id(work): work.duration_us for work in ordered}
    open_works = []
    for work in ordered:
        while open_works and open_works[-1].start_us + open_works[-1].duration_us <= work.start_us:
            open_works.pop()
        if open_works:
            own[id(open_works[-1])] -= work.duration_us
        open_works.append(work)
    return [(work, max(own[id(work)], 0.0)) for work in ordered]


def busy_us(works):
    """The length of the union of the events' intervals: the time anything ran, however many lanes at once."""
    total, reach = 0.0, None
    for start, end in sorted((work.start_us, work.start_us + work.duration_us) for work in works):
        if reach is None or start > reach:
            total += end - start
            reach = end
        elif end > reach:
            total += end - reach
            reach = end
    return total


def trace_events(trace):
    """A parsed trace's events: the file's list, or its `traceEvents`."""
    return trace["traceEvents"] if isinstance(trace, dict) else trace


def complete_events(trace):
    """The duration events ("ph": "X") of a parsed trace."""
    return [event for event in trace_events(trace) if event.get("ph") == "X" and "dur" in event]


def names_of(trace, kind):
    """{pid or (pid, tid): name} from the trace's "process_name" or "thread_name" metadata events."""
    names = {}
    for event in trace_events(trace):
        if event.get("ph") == "M" and event.get("name") == kind:
            key = event["pid"] if kind == "process_name" else (event["pid"], event.get("tid"))
            names[key] = event.get("args", {}).get("name", "")
    return names
