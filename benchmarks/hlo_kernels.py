"""The kernels of a program XLA has optimised, read from its HLO text: what a device launches for one call of the
program, what each reads and writes, and how long a device could take at its datasheet peaks.

Each instruction of the entry computation that does work is one kernel: a fusion, a library call (cuBLAS, cuDNN),
a copy. Parameters, constants, tuples and bitcasts move nothing. A kernel's bytes are its operands' and its
result's sizes: what it names, an upper bound of the memory it touches; but an operand a fusion reads only part of
is charged the share its result needs (`taken_bytes`: the label's logit gathered from the logits, 16,384 values,
not 1.6 GB; a third of a weight gradient, squared and summed, a third of it).
A scatter updates its first operand in place (where it cannot, XLA copies the operand first, in a kernel of its
own): it is charged its other operands, the indices and what the updates are made from, twice (read, and as many
elements written), not the array it updates. A matrix multiplication's FLOPs
are counted from the shapes of its `dot`s (`benchmarks/profile_step.hlo_operations`); a fused attention's from its
query, key and value.

The roofline time of a kernel is the longer of its FLOPs at the device's matmul peak and its bytes at the
device's memory bandwidth; the program's is their sum, a floor no schedule beats and a way to set two programs
side by side on a device that is not here."""

import collections
import re
from dataclasses import dataclass

from benchmarks.profile_step import MATMUL, hlo_computations, hlo_operations

ELEMENT_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4, "u32": 4,
                 "f32": 4, "s64": 8, "u64": 8, "f64": 8}
ARRAY = re.compile(r"\b(" + "|".join(ELEMENT_BYTES) + r")\[([\d,]*)\]")
INSTRUCTION = re.compile(r"^(?:ROOT )?%([\w.\-]+) = (.+?) ([a-z][a-z\-]*)\(([^()]*)\)")
NO_WORK = {"parameter", "constant", "tuple", "get-tuple-element", "bitcast", "after-all", "partition-id",
           "replica-id"}
ATTENTION_CALL = re.compile(r'custom_call_target="(__cudnn\$fmha[^"]*)"')
ATTENTION = "fused attention"


@dataclass
class Kernel:
    name: str
    kind: str       # MATMUL, ATTENTION, "copies", "library calls", "reductions", "element-wise"
    bytes: int      # operands' and result's sizes
    flops: float    # matrix multiplications and fused attention; 0 for the rest


def elements(dims):
    """The elements of an array of `dims` as HLO writes them ('768,2304'; '' for a scalar)."""
    count = 1
    for dim in filter(None, dims.split(",")):
        count *= int(dim)
    return count


def array_bytes(shape_text):
    """The bytes of every array an HLO shape names (a tuple's elements summed)."""
    return sum(elements(dims) * ELEMENT_BYTES[element] for element, dims in ARRAY.findall(shape_text))


def entry_lines(hlo_text):
    lines = hlo_text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("ENTRY "))
    body = []
    for line in lines[start + 1:]:
        if line.startswith("}"):
            break
        body.append(line.strip())
    return body


TAKING = ("gather", "slice", "dynamic-slice")  # read part of their first operand
# Each element of the result made of the elements of the operands at its place (or of one row of them, a reduce's):
# a fusion reads of an operand only what the elements it computes need.
NOT_ELEMENTWISE = {"dot", "convolution", "broadcast", "concatenate", "pad", "scatter", "dynamic-update-slice", "sort",
                   "custom-call", "fusion", "call", "while", "conditional", "reduce-window", "select-and-scatter",
                   "fft", "triangular-solve", "cholesky", "tuple", "get-tuple-element", "parameter", "constant",
                   "iota", "rng", "rng-bit-generator"}


def element_count(shape):
    """The elements of a one-array HLO shape; None for a tuple."""
    arrays = ARRAY.findall(shape)
    return elements(arrays[0][1]) if len(arrays) == 1 else None


def taken_bytes(body):
    """{parameter index: the bytes read of it} of a fused computation's parameters that it reads only part of, as
    many of their elements as its result needs: what a gather or slice takes, followed back through the
    element-wise operations and reductions before it (each result element needs the operands' elements at its
    place, or one row of them). The others are read whole.

    Each value's needed share of its elements, from the root's (all) back to the parameters: a slice or gather
    needs of its first operand the share of the elements it takes; an element-wise operation or a reduction passes
    on its own share; any other use needs its operands whole. The shares of a value's uses add up (an upper bound
    where they overlap), to at most all."""
    instructions = []
    for line in body:
        match = INSTRUCTION.match(line)
        if match:
            name, shape, opcode, operands = match.groups()
            instructions.append((name, shape, opcode, re.findall(r"%([\w.\-]+)", operands), operands))
    if not instructions:
        return {}
    shapes = {name: shape for name, shape, *_ in instructions}
    root = next((line for line in body if line.startswith("ROOT ")), None)
    needed = {INSTRUCTION.match(root).group(1) if root else instructions[-1][0]: 1.0}  # written whole
    for name, shape, opcode, names, _ in reversed(instructions):
        share = needed.get(name, 0.0)
        for position, operand in enumerate(dict.fromkeys(names)):
            own, theirs = element_count(shape), element_count(shapes.get(operand, ""))
            if opcode in TAKING and position == 0 and own is not None and theirs:
                passed = share * own / theirs
            elif opcode == "reduce" and own is not None and theirs:
                passed = share
            elif opcode not in NOT_ELEMENTWISE and own is not None and own == theirs:
                passed = share
            else:
                passed = 1.0 if share else 0.0
            needed[operand] = min(1.0, needed.get(operand, 0.0) + passed)
    taken = {}
    for name, parameter_shape, opcode, _, operands in instructions:
        if opcode == "parameter" and needed.get(name, 0.0) < 1.0:
            taken[int(operands)] = round(needed.get(name, 0.0) * array_bytes(parameter_shape))
    return taken


def attention_flops(operand_shapes, line):
    """A cuDNN attention call's FLOPs from its query (batch, queries, heads, size) and key (batch, keys, ...): the
    forward's two products, 4 x batch x heads x queries x keys x size, two and a half times that backward (five
    products), halved where the mask is causal."""
    query, key = operand_shapes[0], operand_shapes[1]
    batch, queries, heads, size = query
    flops = 4.0 * batch * heads * queries * key[1] * size
    if "Backward" in ATTENTION_CALL.search(line).group(1):
        flops *= 2.5
    return flops / 2 if re.search(r'"mask_type":\s*"CAUSAL"', line) else flops


def entry_kernels(hlo_text):
    """The kernels of an optimised HLO module (`compiled.as_text()`), in program order."""
    operations = hlo_operations(hlo_text)
    bodies = hlo_computations(hlo_text)
    sizes, dims, kernels = {}, {}, []
    for line in entry_lines(hlo_text):
        match = INSTRUCTION.match(line)
        if not match:
            continue
        name, shape, opcode, operands = match.groups()
        sizes[name] = array_bytes(shape)
        arrays = ARRAY.findall(shape)
        dims[name] = [int(d) for d in arrays[0][1].split(",") if d] if len(arrays) == 1 else None
        if opcode in NO_WORK:
            continue
        names = re.findall(r"%([\w.\-]+)", operands)
        called = re.search(r"calls=%([\w.\-]+)", line)
        # XLA names a fusion, and the computation it calls, after its kind: `input_reduce_fusion`, `fused_scatter`.
        named = f"{name} {called.group(1) if called else ''}"
        scatter = opcode == "scatter" or "scatter" in named
        if scatter and names and dims.get(names[0]) == dims[name] and sizes[names[0]] == sizes[name]:
            moved = 2 * sum(sizes.get(operand, 0) for operand in names[1:])  # in place
        else:
            taken = taken_bytes(bodies.get(called.group(1), [])) if called and opcode == "fusion" else {}
            moved = sizes[name] + sum(taken.get(index, sizes.get(operand, 0)) for index, operand in enumerate(names))
        category, flops = operations.get(name, (None, 0))
        if ATTENTION_CALL.search(line):
            kind, flops = ATTENTION, attention_flops([dims.get(operand) for operand in names], line)
        elif category == MATMUL:  # XLA's own GEMM fusions, and cuBLAS calls
            kind = MATMUL
        elif opcode in ("copy", "transpose", "copy-start", "copy-done"):
            kind = "copies"
        elif opcode == "custom-call":
            kind = "library calls"
        elif scatter or "reduce" in named or opcode in ("reduce", "reduce-window"):
            kind = "reductions"
        else:
            kind = "element-wise"
        kernels.append(Kernel(name, kind, moved, float(flops)))
    return kernels


def roofline_seconds(kernel, peak_flops, bandwidth):
    return max(kernel.flops / peak_flops, kernel.bytes / bandwidth)


def kernel_figures(hlo_text, peak_flops=None, bandwidth=None):
    """{'kernels': count, 'kernel GB': bytes named / 1e9, 'matmul TFLOP', and per kind 'kernels: KIND' and
    'GB: KIND'}; with a device's peaks also 'roofline ms' and 'roofline ms: KIND'."""
    kernels = entry_kernels(hlo_text)
    figures = {"kernels": len(kernels), "kernel GB": sum(k.bytes for k in kernels) / 1e9,
               "matmul TFLOP": sum(k.flops for k in kernels if k.kind == MATMUL) / 1e12}
    by_kind = collections.defaultdict(list)
    for kernel in kernels:
        by_kind[kernel.kind].append(kernel)
    if peak_flops and bandwidth:
        figures["roofline ms"] = sum(roofline_seconds(k, peak_flops, bandwidth) for k in kernels) * 1e3
    for kind in sorted(by_kind):
        figures[f"kernels: {kind}"] = len(by_kind[kind])
        figures[f"GB: {kind}"] = sum(k.bytes for k in by_kind[kind]) / 1e9
        if peak_flops and bandwidth:
            figures[f"roofline ms: {kind}"] = sum(roofline_seconds(k, peak_flops, bandwidth)
                                                  for k in by_kind[kind]) * 1e3
    return figures

