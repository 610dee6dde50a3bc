"""mtbench's torch step with its forward pass and loss compiled by `torch.compile`.

Only `EagerTorchTrainStep._loss_and_accuracy` is compiled; AOTAutograd compiles its backward alongside, and the
fused AdamW update stays outside, as in the eager step (it is one fused kernel already, and inside the graph
its Python-side schedule and step counter would each be a break).

Traced through Keras as it is, the forward breaks the graph in every layer call: `Layer.__call__` flattens its
arguments with a tree helper dynamo cannot trace (`is not` between tuples) and binds them to the call signature
with `inspect` (a mapping proxy dynamo refuses after mutation), and where that happens inside the name scope
it opens, dynamo gives up on the whole frame and runs it eagerly. (`dot_product_attention` asked to choose the
kernel itself would break the graph once more per attention, building a pybind `SDPAParams`; mtbench's attention
layers never ask it to choose: they pass `flash_attention` True or False. Asked for flash (True), Keras builds one
all the same, to check that flash takes the inputs: `flash_checked_by_the_kernel` leaves that check to the kernel.) The eager step's own context,
`torch_plain_calls.plain_layer_calls`, entered around the compiled call (never traced), removes the layer-call
breaks without changing a number; this step refuses a model that needs `Layer.__call__` (`plain_calls_unsupported`),
where the eager step would only fall back to it.

What is left costs compile time, not breaks: dynamo traces every line of Python an operation runs, and in
Keras that is several dozen lines around each torch call. Two kinds of Keras helper take most of them, and
`lighten_keras_for_dynamo` gives dynamo a cheaper way through each, with the same answers:

* the dtype-name helpers (`standardize_dtype`, `result_type`, torch's `to_torch_dtype`) are pure functions of
  dtype names: marked with `torch._dynamo.assume_constant_result`, they are called once at trace time and their
  answer is a constant. (Their one impure input, `keras.config.floatx()` for a dtype of None, is fixed for the
  run.)
* `any_symbolic_tensors`, which every operation calls to tell a symbolic (functional-model) call from an eager
  one, looks for a `KerasTensor` through Keras's tree utilities, whose torch pytree machinery is the costliest
  code dynamo meets here; it gets a substitute (`torch.compiler.substitute_in_graph`, used only while dynamo
  traces) that walks the lists, tuples and dicts those utilities would flatten, with no pytree.

With them, dynamo traces the small preset's forward in about 3 s instead of 5 (the hand-written model of
benchmarks/native_torch.py: 0.4 s); the rest is Keras's own per-operation Python (device and dtype checks,
variable and property reads), which stays. Hierarchical compilation (`torch.compiler.nested_compile_region`
on the encoder and decoder blocks, traced once per class) would cut the small preset's compile by another 2 s,
but with it the losses leave the eager step's from the third step on (1e-5 relative there, growing), where
without it they agree to 1e-7 over every length bucket; it is not used.

Inductor keeps the 16-bit intermediates of a fused kernel in float32 unless told to round them where the program
rounds (`emulate_precision_casts`). That is other arithmetic than the eager step's, and not XLA's either (whose
default skips roundings of its own, `rounding_16_bit`): on an H100 (2026-11-27) the compiled mixed_bfloat16 GPT-2
small's loss left JAX's by 0.47 % at its third step, where nanoGPT's recipe and plain JAX stayed within 0.04 %; on
this CPU the tiny GPT's compiled step left the eager one by 8e-4 at its third step, and by 2e-5 with the casts
emulated. The step emulates them (`PRECISION_CASTS`); inductor's C++ kernels round so from torch 2.13 on, and a run
on an older torch's CPU says they do not.
"""

from mtbench.plugins.backends.rounding_16_bit import NO_16_BIT, computes_in_16_bits
from mtbench.plugins.backends.torch_eager_step import WELFORD, EagerTorchTrainStep, layer_norm_text
from mtbench.plugins.backends.torch_plain_calls import any_keras_tensor, plain_calls_unsupported

COMPILED_PART = "mtbench torch step: forward + loss (backward via AOTAutograd)"
# Graphs dynamo keeps per compiled function before it gives up and runs further shapes eagerly (torch's default
# is 8, exactly the `base` preset's length buckets). Raised so that every bucket, of any preset, is compiled;
# a shape that still runs eagerly is counted and shown beside the step's name.
RECOMPILE_LIMIT = 64
# The modes in which inductor captures the compiled graphs in CUDA graphs (on a GPU).
CUDA_GRAPH_MODES = ("reduce-overhead", "max-autotune")
PRECISION_CASTS = "16-bit intermediates rounded where the eager step rounds them (inductor emulate_precision_casts)"
INDUCTOR_DEFAULT_CASTS = "16-bit intermediates kept in float32 within fused kernels (inductor's default)"
PRECISION_CASTS_NOT_IN_CPP = (PRECISION_CASTS + ", except inside inductor's C++ (CPU) kernels, which torch < 2.13 "
                              "fuses in float32")
# The first torch whose C++ kernels round where the program rounds (its Triton kernels did before).
CPP_CASTS_SINCE = (2, 13)


def cpp_kernels_round():
    """Whether this torch's C++ kernels round 16-bit values where the program does, when told to."""
    import torch
    return tuple(int(part) for part in torch.__version__.split("+")[0].split(".")[:2]) >= CPP_CASTS_SINCE


def precision_casts(device_type):
    """How the compiled step's 16-bit intermediates are rounded on a device of `device_type` ('cpu', 'gpu', ...),
    as inductor's configuration and torch's version have it."""
    import torch._inductor.config
    if not torch._inductor.config.emulate_precision_casts:
        return INDUCTOR_DEFAULT_CASTS
    return PRECISION_CASTS_NOT_IN_CPP if device_type == "cpu" and not cpp_kernels_round() else PRECISION_CASTS


_substitutes_registered = False


def lighten_keras_for_dynamo():
    """Gives dynamo the cheaper ways through Keras's helpers (see the module's docstring). Marks and substitutes
    apply to the function objects, so every module that imported them sees them; they change nothing outside
    dynamo's tracing."""
    global _substitutes_registered
    import torch
    from keras.src.backend.common import dtypes, keras_tensor, variables
    from keras.src.backend.torch import core
    from keras.src.backend.torch import nn as torch_nn
    for helper in (variables.standardize_dtype, dtypes.result_type, core.to_torch_dtype):
        torch._dynamo.assume_constant_result(helper)
    if _substitutes_registered:  # dynamo refuses a second substitute for one function
        return

    torch.compiler.substitute_in_graph(keras_tensor.any_symbolic_tensors)(any_keras_tensor)
    torch.compiler.substitute_in_graph(torch_nn._can_use_flash_attention)(flash_checked_by_the_kernel)

    _substitutes_registered = True


def flash_checked_by_the_kernel(query, key, value, mask=None, is_causal=False, raise_error=False):
    """Keras's `_can_use_flash_attention` as dynamo traces it, without the pybind `SDPAParams` it cannot trace (a
    graph break in every fused attention). Asked for flash, Keras ignores the answer and calls SDPA held to the
    flash kernel alone (`sdpa_kernel`), which raises for inputs flash cannot take, so the check is not lost;
    asked to choose (which mtbench's layers never do), it reads the answer: False keeps the backend's kernels."""
    return False


def dynamo_counters():
    """Dynamo's process-wide counters of graphs, frames and graph breaks (with the ten commonest reasons)."""
    from torch._dynamo.utils import counters
    breaks = dict(counters["graph_break"])
    return {
        "graphs_compiled": int(counters["stats"]["unique_graphs"]),
        "frames_compiled": int(counters["frames"]["ok"]),
        "graph_breaks": int(sum(breaks.values())),
        "graph_break_reasons": dict(sorted(breaks.items(), key=lambda kv: -kv[1])[:10]),
    }


# The longest row one Triton kernel reduces whole, held in registers: torch's `should_use_persistent_reduction`
# (torch 2.11 to 2.13) for a reduction over the innermost axis, as a layer norm's; 16 times that under multi_kernel.
PERSISTENT_REDUCTION_ROW_LENGTH = 1024


def inductor_norm_form(width, device_type):
    """How inductor computes a layer norm's statistics over rows of `width` on a device of `device_type` ('cpu',
    'cuda'), for the float32 rows mtbench's kernel normalises. Its lowering turns `layer_norm` into a `var_mean`
    of two passes (the mean, then the squared deviations) for short rows (`use_two_step_variance`: on a CPU those
    of up to `config.cpp.use_two_step_variance_threshold`, 1,024 in torch 2.13; elsewhere of up to
    `unroll_reductions_threshold`, 8), else into a Welford reduction. On a GPU, Triton's code for a Welford
    reduction that one persistent reduction holds (a row of up to `PERSISTENT_REDUCTION_ROW_LENGTH`) is two passes
    again, over the row in registers (`welford_reduce_fallback`): a GPT-2-small row of 768 is normalised in two
    passes there. Forced cooperative reductions keep Welford's (inductor makes none of such short rows unforced);
    `multi_kernel` 1 builds a persistent and a looped kernel and runs the one it times faster, 2 and 3 force one."""
    from torch._inductor import config
    threshold = config.unroll_reductions_threshold
    if device_type == "cpu":
        threshold = getattr(config.cpp, "use_two_step_variance_threshold", threshold)
    else:
        triton = config.triton
        multi_kernel = int(getattr(triton, "multi_kernel", 0))
        if (triton.persistent_reductions and multi_kernel != 3
                and not getattr(triton, "force_cooperative_reductions", False)):
            length = PERSISTENT_REDUCTION_ROW_LENGTH * (16 if multi_kernel else 1)
            if multi_kernel == 1 and width is not None and threshold < width <= length:
                return (f"two passes in float32 or Welford's one pass, whichever of inductor's two kernels for rows "
                        f"of at most {length:,} it timed faster")
            threshold = max(threshold, length)
    if width is not None and width <= threshold:
        return (f"two passes in float32, the mean then the squared deviations, as inductor does rows of at most "
                f"{threshold:,}")
    return WELFORD


def norm_width(norm):
    """The length of the rows a layer norm normalises (its scale's or offset's), or None where it has neither."""
    weight = norm.gamma if norm.gamma is not None else norm.beta
    return None if weight is None else int(weight.shape[-1])


class CompiledTorchTrainStep(EagerTorchTrainStep):
    name = "torch-compiled"
    # A CUDA-graph replay reuses its outputs' memory; and even without CUDA graphs, the compiled step's first
    # loss, read after the update, was one ulp off on the CPU unless copied: the step returns copies in every mode.
    outputs_overwritten = True

    def __init__(self, model, mode=None, micro_batches=1):
        """`mode`: torch.compile's mode (None: its default); `micro_batches` as the eager step's."""
        import torch
        import torch._inductor.config
        from torch._dynamo.utils import calculate_time_spent

        from mtbench import MtbenchError
        reason = plain_calls_unsupported(model)
        if reason:
            raise MtbenchError(f"{reason}; the compiled step runs Keras layers' call() directly")
        super().__init__(model, micro_batches)
        lighten_keras_for_dynamo()
        self.mode = mode
        self.shapes_seen = set()
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, RECOMPILE_LIMIT)
        torch._inductor.config.emulate_precision_casts = True  # the eager step's arithmetic (module docstring)
        # One graph per length bucket: the buckets are few, and static shapes give inductor fixed tile sizes.
        self._forward = torch.compile(self._loss_and_accuracy, mode=mode, dynamic=False)
        # What is compiled, and the code whose graphs the step's figures count (`compile_in_place`).
        # The update runs eagerly after it: torch's fused AdamW, or Keras's optimizer.apply where that is refused.
        update = ("fused AdamW update eager" if self.fused_optimizer_refused is None else
                  f"update eager by Keras's optimizer.apply ({self.fused_optimizer_refused})")
        self.compiled_part = f"{COMPILED_PART}; {update}"
        self.compiled_code = EagerTorchTrainStep._loss_and_accuracy.__code__
        self._compile_seconds_before = calculate_time_spent().get("total_wall_time", 0.0)

    def numerics(self):
        # inductor generates the norms' code: its `var_mean`, not torch's layer_norm kernel.
        device_type = self.device_type()
        form_of = lambda norm: inductor_norm_form(norm_width(norm), device_type)  # noqa: E731
        return {**super().numerics(), "layer_norm": layer_norm_text(self.model, form_of, "inductor's var_mean")}

    def rounding_16_bit(self):
        # inductor's kernels round as it is configured (the step asks it to round as the eager step does).
        return precision_casts(self.device_type()) if computes_in_16_bits(self.model) else NO_16_BIT

    def device_type(self):
        """The type of the device the model's weights are on ('cpu', 'cuda'), which inductor generates code for."""
        return self.model.weights[0].value.device.type if self.model.weights else "cpu"

    def compile_in_place(self, function, part):
        """`function` compiled as this step compiles its forward (its mode, static shapes), for a step that runs
        `function` in place of this one's forward (a pipeline stage's blocks): the figures of the step then count
        `function`'s graphs, and `part` says what is compiled."""
        import torch
        self.compiled_part, self.compiled_code = part, function.__code__
        return torch.compile(function, mode=self.mode, dynamic=False)

    def _graphs_cached(self):
        """The graphs dynamo holds for the compiled code: one per shape it compiled."""
        from torch._dynamo.eval_frame import _debug_get_cache_entry_list
        return len(_debug_get_cache_entry_list(self.compiled_code))

    @property
    def warmup_calls(self):
        """Inductor's CUDA graphs (cudagraph trees) run a shape's first call to warm up and record the graph on its
        second: that call is warm-up too. Without CUDA graphs only the first call compiles."""
        import torch
        return 2 if (self.mode or "default") in CUDA_GRAPH_MODES and torch.cuda.is_available() else 1

    def __call__(self, x, y, sample_weight):
        self.shapes_seen.add(tuple(y.shape))
        return super().__call__(x, y, sample_weight)

    def shapes_run_eagerly(self):
        """Shapes this step trained that have no compiled graph: dynamo ran them eagerly (its recompile limit)."""
        return max(len(self.shapes_seen) - self._graphs_cached(), 0)

    def cuda_graphs(self):
        """Whether the compiled graphs ran as CUDA graphs: 'not used' (mode), 'not on this device', 'every
        graph', or how many graphs inductor skipped (it logs why; `cudagraph_skips` counts them)."""
        import torch
        from torch._dynamo.utils import counters
        if (self.mode or "default") not in CUDA_GRAPH_MODES:
            return f"not used (mode {self.mode or 'default'})"
        if not torch.cuda.is_available():
            return "not used: no CUDA device (CUDA graphs need one)"
        skipped = int(counters["inductor"]["cudagraph_skips"])
        return f"skipped for {skipped} graph(s)" if skipped else "every compiled graph"

    def description(self):
        eager = self.shapes_run_eagerly()
        parts = [f"mode {self.mode or 'default'}", f"CUDA graphs: {self.cuda_graphs()}"]
        if eager:
            parts.append(f"{eager} of {len(self.shapes_seen)} shapes ran eagerly")
        return ", ".join(parts + [part for part in [super().description()] if part])

    def compilations(self):
        """How often the compiled function itself was compiled: once per input shape (length bucket), since
        shapes are static; `recompile_limit_reached` says dynamo gave up compiling new shapes and ran them
        eagerly. Counted on the compiled code, which all instances share: right for one compiled step per
        process, as mtbench trains."""
        import torch
        compiled = self._graphs_cached()
        return {"recompilations": max(compiled - 1, 0),
                "recompile_limit_reached": compiled >= torch._dynamo.config.recompile_limit}

    def compile_seconds(self):
        """Seconds dynamo, AOTAutograd and inductor have spent compiling this step so far (forward and backward),
        as torch accounts them."""
        from torch._dynamo.utils import calculate_time_spent
        return calculate_time_spent().get("total_wall_time", 0.0) - self._compile_seconds_before
