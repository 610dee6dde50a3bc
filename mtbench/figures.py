"""The figures of a result, defined once: where each is read from, what it is called and how it is shown.

Every output (the single-run table, the comparison table, markdown, CSV, JSON and the plot) takes its figures
from here, so they cannot disagree about what a figure is.
"""

import math
from dataclasses import dataclass
from typing import Callable

MIB = 2 ** 20


# Past this a figure's digits beyond its fourth say nothing (no speed or memory of these runs reaches it).
COMPACT_FROM = 1e9


@dataclass(frozen=True)
class Figure:
    key: str                  # the name in CSV and JSON outputs, which carry the raw value
    title: str                # the name in tables, with the unit shown
    section: str
    read: Callable            # result dict -> number or None
    display_scale: float = 1.0  # shown value = raw value x display_scale
    decimals: int = 3
    is_timing: bool = False   # varies between repeats of the same run: shown as median and min-max
    task: str = None          # the task whose runs alone have it (translation's test decoding); None: every run's

    def value(self, result):
        return self.read(result)

    def text(self, value):
        """The value as tables show it; 'n/a' where the run has no such figure (device memory on a CPU)."""
        if value is None:
            return "n/a"
        shown = value * self.display_scale
        if abs(shown) >= COMPACT_FROM:
            return f"{shown:.4g}"  # a diverged model's perplexity: 1.685e+15, not 22 digits and 5 commas
        return f"{shown:,.{self.decimals}f}"



def _timing(key):
    return lambda result: result["timing"][key]


def _memory(key):
    return lambda result: result["memory"][key]


def _section(result, *keys):
    """A figure inside an optional section (energy, cost: absent from results of earlier versions)."""
    value = result
    for key in keys:
        value = (value or {}).get(key)
    return value


def _metric(key):
    return lambda result: result["metrics"].get(key)  # a task's own: a language model has no BLEU


FIGURES = (
    Figure("compile_s", "compile (s)", "timing", _timing("compile_s"), decimals=2, is_timing=True),
    Figure("step_s_median", "steady step, median of window means (ms)", "timing", _timing("step_s_median"), 1000, 1,
           True),
    Figure("step_s_p90", "steady step, p90 of window means (ms)", "timing", _timing("step_s_p90"), 1000, 1, True),
    Figure("tokens_per_s", "tokens/s (target, steady)", "timing", _timing("tokens_per_s"), decimals=0,
           is_timing=True),
    Figure("train_s", "train time (s)", "timing", _timing("train_s"), decimals=1, is_timing=True),
    Figure("total_s", "total time (s)", "timing", _timing("total_s"), decimals=1, is_timing=True),
    Figure("translate_s", "test translation (s)", "timing",
           lambda result: result["timing"].get("phases_s", {}).get("translate"), decimals=1, is_timing=True,
           task="translation"),
    Figure("mfu", "MFU (padded, %)", "timing", lambda result: (result.get("utilization") or {}).get("mfu"), 100, 1,
           True),
    Figure("mfu_real_tokens", "MFU (real tokens, %)", "timing",
           lambda result: (result.get("utilization") or {}).get("mfu_real_tokens"), 100, 1, True),
    Figure("joules_per_1k_tokens", "energy, steady (J / 1k tokens)", "energy",
           lambda result: _section(result, "energy", "steady", "joules_per_1k_tokens"), decimals=2, is_timing=True),
    Figure("usd", "cost of the run (USD)", "cost", lambda result: _section(result, "cost", "usd"), decimals=4,
           is_timing=True),
    Figure("usd_to_target", "cost to target quality (USD)", "cost",
           lambda result: _section(result, "cost", "usd_to_target"), decimals=4, is_timing=True),
    Figure("peak_host_bytes", "peak host memory (MiB)", "memory", _memory("peak_host_bytes"), 1 / MIB, 0),
    Figure("peak_training_device_bytes", "peak training memory, largest device (MiB)", "memory",
           lambda result: training_peak_bytes(result), 1 / MIB, 0),
    Figure("state_bytes_per_device", "training state, largest device (MiB)", "memory",
           lambda result: state_bytes_per_device(result), 1 / MIB, 1),
    Figure("peak_device_bytes", "peak device memory, whole run, largest device (MiB)", "memory", _memory("peak_device_bytes"),
           1 / MIB, 0),
    Figure("train_loss", "train loss", "quality", _metric("train_loss")),
    Figure("val_loss", "validation loss", "quality", _metric("val_loss")),
    Figure("test_loss", "test loss", "quality", _metric("test_loss")),
    Figure("train_accuracy", "train token accuracy", "quality", _metric("train_accuracy")),
    Figure("val_accuracy", "validation token accuracy", "quality", _metric("val_accuracy")),
    Figure("test_accuracy", "test token accuracy", "quality", _metric("test_accuracy")),
    Figure("bleu", "BLEU (test)", "quality", _metric("bleu"), decimals=2),
    Figure("chrf", "chrF (test)", "quality", _metric("chrf"), decimals=2),
    Figure("val_perplexity", "validation perplexity", "quality", _metric("val_perplexity"), decimals=2),
    Figure("test_perplexity", "test perplexity", "quality", _metric("test_perplexity"), decimals=2),
    Figure("val_bits_per_byte", "validation bits per byte", "quality", _metric("val_bits_per_byte")),
    Figure("test_bits_per_byte", "test bits per byte", "quality", _metric("test_bits_per_byte")),
)
FIGURES_BY_KEY = {figure.key: figure for figure in FIGURES}


def last_step(result):
    """The last step a result's run trained (of a partial result, where it stopped), or None for one that trained
    none."""
    return (result.get("history") or [{}])[-1].get("step")


def shown_figures(results):
    """The FIGURES that `results` have: every figure but those of a task no result trained (a language model's
    run has no BLEU and no test translation, a translation's no perplexity), which would only show 'n/a'."""
    tasks = {(result.get("config") or {}).get("task") or "translation" for result in results}  # schema 5 on
    return [figure for figure in FIGURES if (figure.task is None or figure.task in tasks)
            and (figure.section != "quality" or any(figure.key in (result.get("metrics") or {}) for result in results))]


def state_bytes_per_device(result):
    """Parameters, gradients and optimizer state the largest device held while training, as the extra that
    placed them recorded (`extras_record[name]['state_bytes']`: ddp, data-parallel, fsdp); None where none did."""
    recorded = [record["state_bytes"] for record in (result.get("extras_record") or {}).values()
                if isinstance(record, dict) and record.get("state_bytes") is not None]
    return max(recorded) if recorded else None


def training_peak_bytes(result):
    """The largest device's peak memory while training (`memory.training`), None where none was reported."""
    per_device = _section(result, "memory", "training", "per_device")
    return max(device["peak_bytes"] for device in per_device) if per_device else None


def train_step_text(result):
    """The train step that ran, with how it ran ('torch-compiled (mode reduce-overhead, CUDA graphs: ...)')."""
    detail = result.get("train_step_detail")
    return f"{result['train_step']} ({detail})" if detail else result["train_step"]


def loss_scaling_text(result):
    """float16's loss scaling as the run left it ('loss scaled from 2^15, 2 steps skipped, now 2^13'), or ''."""
    scaling = result.get("loss_scaling")
    if not scaling:
        return ""
    skipped = scaling["steps_skipped"]
    return (f"loss scaled from 2^{math.log2(scaling['initial_scale']):g}, {skipped} step{'s' * (skipped != 1)} "
            f"skipped (gradients not finite), now 2^{math.log2(scaling['final_scale']):g}")


def loss_scaling_choice_text(result):
    """float16's loss scaling as the run left it (`loss_scaling_text`), or 'none' for a dtype policy that needs
    none: beside the losses of a float16 run, the updates it skipped."""
    return loss_scaling_text(result) or "none"


def energy_counter_text(result):
    """The energy counter a run's joules come from and what it counts ('nvml: GPUs only (...)'), or why the run
    has none ('none: nvidia-ml-py is not installed ...'); 'not recorded' for results before energy was read."""
    energy = result.get("energy") or {}
    if energy.get("source"):
        return f"{energy['source']}: {energy.get('counts') or 'what it counts not recorded'}"
    return f"none: {energy['reason']}" if energy.get("reason") else "not recorded"


def attention_text(result):
    """The attention implementation each kind of attention ran (one name when both kinds ran the same), in a
    16-bit dtype the arithmetic of the training attention (`model.attention.arithmetic`) where recorded, and
    whether the query, key and value were three products, and the share of its probabilities dropped."""
    attention = result["model"].get("attention")
    if attention == {}:
        return "none named (the model family runs no attention mtbench holds to a kernel)"
    causal, masked = (attention or {}).get("causal"), (attention or {}).get("masked")
    if causal is None:
        return "not recorded"
    if masked is None:  # a decoder-only model has no padding mask
        kernels = f"causal {causal}"
    else:
        kernels = causal if causal == masked else f"causal {causal}, masked {masked}"
    arithmetic = attention.get("arithmetic")
    # One product is the models' way; a run of three (or from before it was recorded, which ran three) says so.
    three = arithmetic and arithmetic.get("projections", "separate") == "separate"
    notes = "; query, key and value in three products" if three else ""
    dropped = arithmetic and arithmetic.get("probability_dropout")
    notes += f"; {dropped:g} of its probabilities dropped while training" if dropped else ""
    if not arithmetic or arithmetic["matmul_inputs"] == "float32":
        return kernels + notes
    return (f"{kernels}; {arithmetic['matmul_inputs']} matmuls summing in {arithmetic['accumulation']}, "
            f"{arithmetic['scores']} scores, {arithmetic['softmax']} softmax{notes}")


def layer_norm_text(result):
    """How the train step computed each layer norm's mean and variance (`train_step_numerics`): in one pass as the
    mean of squares (mtbench's JAX steps) or by Welford's (torch's kernel); 'not recorded' for a step that does not
    say, and in earlier results."""
    return _numerics_text(result, "layer_norm")


def optimizer_update_text(result):
    """What carried out the optimizer's update (`train_step_numerics`): Keras's optimizer compiled into JAX's step,
    torch's fused AdamW kernel, or Keras's `apply`; 'not recorded' for a step that does not say, and in earlier
    results."""
    return _numerics_text(result, "optimizer_update")


def rounding_16_bit_text(result):
    """Where the train step rounded its 16-bit intermediates (`train_step_numerics`): where the program rounds them
    (torch's steps; XLA told so), or, XLA's default, kept in float32 between some fused operations; 'not recorded'
    for a step that does not say, and in earlier results."""
    return _numerics_text(result, "rounding_16_bit")


def _numerics_text(result, key):
    return (result.get("train_step_numerics") or {}).get(key) or "not recorded"


MATMUL_PRECISION_NAMES = {"highest": "highest (IEEE float32)", "high": "high (TF32 where the device has it)"}


def matmul_precision_text(result):
    """The arithmetic of float32 matmuls the run asked both frameworks for (results before it was set: not
    recorded, and XLA then ran TF32 on GPUs that have it where torch did not), and whether the backend said it set
    it: a plugin backend that reports nothing (`Backend.set_matmul_precision` returning None) ran its own."""
    precision = result["config"].get("matmul_precision")
    text = MATMUL_PRECISION_NAMES.get(precision, "not recorded")
    recorded = (result.get("env") or {}).get("matmul_precision")
    if precision in MATMUL_PRECISION_NAMES and isinstance(recorded, dict) and recorded.get("reported") is None:
        text += ", asked; the backend reported no setting"
    return text


def inference_text(result):
    """How the backend ran the model for inference, its test translations and samples (`model.inference`):
    compiled into one program, or eager, a decoding loop driven from Python; 'not recorded' before 2026-12-03
    or where a backend does not say."""
    return (result.get("model") or {}).get("inference") or "not recorded"


def compile_cache_text(result):
    """Whether the run's compilation came from the persistent cache ('cold', 'warm (12 hits)', 'off'), by the
    run's own lookups where the backend counts them, else by whether the cache held programs as it started."""
    cache = _section(result, "timing", "compile_cache")
    if not cache:
        return "none (nothing compiled ahead)"
    if cache["state"] == "off":  # by choice, or a torch step that compiles nothing; else said why
        return f"off: {cache['reason']}" if cache.get("unusable_dir") else "off"
    programs = cache.get("programs")
    if programs is None:
        held = cache["entries_before"]
        return f"{cache['state']} (held {held} program{'s' * (held != 1)} as the run started)"
    every = cache.get("every_process")
    if every:
        return f"{programs} ({_lookups(every)} over {every['processes']} processes)"
    return f"{programs} ({_lookups(cache)})"


def _lookups(counts):
    """'13 hits, 1 miss'."""
    hits, misses = counts["hits"], counts["misses"]
    return f"{hits} hit{'s' * (hits != 1)}, {misses} miss{'es' * (misses != 1)}"


def cores_text(result):
    """The CPU cores each of the run's processes computed on: its share where several shared a machine
    (`processes.cpu_share`: pinned to its cores, as many threads), else every core it was allowed, and the threads
    of the framework's CPU kernels where it recorded them (torch's intra-op threads on a CPU: its default is the
    physical cores, half the CPUs a machine with two threads a core lists, where XLA's pool takes them all)."""
    share = (result.get("processes") or {}).get("cpu_share")
    if share:
        threads = f"{share['threads']} thread" + ("s" if share["threads"] != 1 else "")
        return (f"pinned to {len(share['cpus'])} of {share['of_cpus']} cores, {threads} "
                f"({share['local_processes']} processes on the machine)")
    cores = result["env"].get("cpu_count")
    if not cores:
        return "not recorded"
    threads = (result["env"].get("device") or {}).get("threads")
    return f"every core it may use ({cores})" + (f", {threads} intra-op thread{'s' * (threads != 1)}" if threads else "")


# What ran, beside the figures of every run: what changes the arithmetic or the kind of work.
# (key in JSON and CSV, title in tables, the text of a result)
def host_syncs_text(result):
    """The host waits counted inside one steady train step ('0 (step 2)', or each wait with where it came from);
    'not counted' for a backend (or a result) without a counter."""
    record = result.get("host_syncs")
    if not record:
        return "not counted"
    if record["per_step"] is None:
        return "not countable on this machine"
    if not record["per_step"]:
        return f"0 (counted on step {record['step']})"
    events = sorted(record["events"].items(), key=lambda item: -item[1])
    return f"{record['per_step']:g} (step {record['step']}): " + "; ".join(f"{count} x {what}" for what, count in events)


def profile_text(result):
    """--profile's steps and where their trace is; None without it (and in results written before it)."""
    profile = result.get("profile")
    if not profile:
        return None
    if not profile["steps"]:
        return f"none: {profile['why_not']}"
    first, last = profile["steps"][0], profile["steps"][-1]
    return (f"steps {first}-{last} ({len(profile['steps'])} of {profile['asked']} asked), timed apart, in "
            f"{profile['directory']} (ui.perfetto.dev opens it)")


def profile_operations_text(result, count=3):
    """Where the profiled steps' time went: how long the device (or, without one, the host) ran anything in a step,
    against an unprofiled steady step (a profiler slows the host, not the kernels) and against the profiled window,
    the `count` operations that took longest, a device's kernels by kind, and, in a run of several processes, the
    least and most busy of them; None without a profile read (and in results written before it)."""
    profile = result.get("profile") or {}
    operations = profile.get("operations")
    if not operations:
        return f"not read: {profile['operations_why_not']}" if profile.get("operations_why_not") else None
    units = operations.get("units", 1)
    per_step = operations["busy_s"] / len(profile["steps"])
    steady = (result.get("timing") or {}).get("step_s_median")
    shares = [f"{per_step / steady * 100:.0f} % of a steady step"] if steady else []
    if operations["busy_share"] is not None:
        shares.append(f"{operations['busy_share'] * 100:.0f} % of the profiled window")
    longest = ", ".join(f"{operation_name(top['name'])} {top['share'] * 100:.0f} % ({top['calls']} calls)"
                        for top in operations["top"][:count])
    who = operations["on"] if units == 1 else f"{units} devices, each"
    every = [(busy / len(profile["steps"]), rank)
             for rank, busy in enumerate(operations.get("processes_busy_s") or []) if busy is not None]
    if len(every) > 1:
        who = f"process 0's {who}"
        (least, least_rank), (most, most_rank) = min(every), max(every)
        shares.append(f"the {len(every)} processes' {least * 1e3:.1f} (process {least_rank}) to {most * 1e3:.1f} ms "
                      f"(process {most_rank})")
    kinds = ", ".join(f"{kind} {seconds * 1e3:.1f} ms ({share * 100:.0f} %)"
                      for kind, (seconds, share) in kinds_per_step(result).items())
    return (f"{who} busy {per_step * 1e3:.1f} ms a step{' on average' if units > 1 else ''} ({'; '.join(shares)}); "
            f"longest: {longest}{f'; kernels a step by kind: {kinds}' if kinds else ''}")


def kinds_per_step(result):
    """{kind: (seconds of a profiled step, on each device; share of the kernels' time)} of a profile read on a
    device, largest first; empty without one."""
    profile = result.get("profile") or {}
    operations = profile.get("operations") or {}
    per_step = len(profile.get("steps") or ()) * operations.get("units", 1)
    return {kind["kind"]: (kind["seconds"] / per_step, kind["share"]) for kind in operations.get("kinds") or []}


def kinds_against_text(result, reference):
    """A run's device time a profiled step in each kind of kernel against its reference's ('matmul 20.1 vs 19.8 ms
    (1.02x), ...'), the reference's largest kinds first; None unless both were read on a device."""
    ours, theirs = kinds_per_step(result), kinds_per_step(reference)
    if not (ours and theirs):
        return None
    parts = []
    for kind in [*theirs, *(kind for kind in ours if kind not in theirs)]:
        mine, best = ours.get(kind, (0.0, 0.0))[0], theirs.get(kind, (0.0, 0.0))[0]
        ratio = f" ({mine / best:.2f}x)" if best else ""
        parts.append(f"{kind} {mine * 1e3:.1f} vs {best * 1e3:.1f} ms{ratio}")
    return ", ".join(parts)


def operation_name(name, width=40):
    """A kernel's or operator's name short enough for a line: a C++ kernel's without its arguments."""
    name = name.removeprefix("void ").split("(")[0].split("<")[0].strip() or name
    return name if len(name) <= width else name[:width - 1] + "…"


def framework_env_text(result):
    """The environment variables set for the run that change what the frameworks compute, which kernels they run
    or on which devices (`env.framework_env`: XLA_FLAGS, inductor's autotuning, TF32 overrides...): 'NAME=value,
    ...', 'none set', or 'not recorded' (a result before 2026-11-24)."""
    recorded = result["env"].get("framework_env")
    if recorded is None:
        return "not recorded"
    return ", ".join(f"{name}={value}" for name, value in sorted(recorded.items()) if value is not None) or "none set"


RUN_CHOICES = (
    ("train_step", "train step", train_step_text),
    ("host_syncs", "host waits per step", host_syncs_text),
    ("attention", "attention", attention_text),
    ("layer_norm", "layer norm statistics", layer_norm_text),
    ("optimizer_update", "optimizer update", optimizer_update_text),
    ("rounding_16_bit", "16-bit rounding", rounding_16_bit_text),
    ("matmul_precision", "float32 matmuls", matmul_precision_text),
    ("inference", "inference (decoding, samples)", inference_text),
    ("compile_cache", "compile cache", compile_cache_text),
    ("loss_scaling", "float16 loss scaling", loss_scaling_choice_text),
    ("cores", "cores and threads", cores_text),
    ("framework_env", "framework environment", framework_env_text),
)


def figure_text(result, key):
    figure = FIGURES_BY_KEY[key]
    return figure.text(figure.value(result))


def is_number(value):
    """Whether `value` is a figure a tracker or a log line can show as a number (a bool is not one)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


# Bounds past which a run's timings carry a warning. Steady steps of several length buckets differ by their
# lengths alone (p90 about 1.2x to 1.5x the median on this project's presets); past 1.5x something else stalled
# some of them. A quiet machine's other processes use about 1 % of its CPUs; a single-threaded neighbour on 2
# cores takes a third of them from a run that would use both.
SCATTER_BOUND = 1.5      # steady step p90 / median
OTHERS_BOUND = 10.0      # percent of the CPUs' time other processes used while the run trained
STEAL_BOUND = 5.0        # percent of the CPUs' time the hypervisor gave to other guests while the run trained
MIN_STEADY_WINDOWS = 3   # timing windows (clock readings) of steady steps below which the median and p90 show no spread
# A split of one corpus shares a few short, formulaic sentences by chance (the default bible-en-fr split, its
# duplicates dropped: 0 of its 500 test sources); past 5 % of them the test scores reward recalling the training
# pairs as well as translating.
TEST_OVERLAP_BOUND = 0.05  # share of the test sources also in the training data


def _gpu_process_text(process):
    """'pid 4242 python3, 20,480 MiB': nvidia-smi names a process by its executable's path, of which the name
    says enough."""
    name = (process.get("name") or "").replace("\\", "/").rsplit("/", 1)[-1]
    memory = process.get("used_memory_mib")
    return f"pid {process['pid']}{f' {name}' if name else ''}{f', {memory:,} MiB' if memory is not None else ''}"


def _loaded(load_average, cores):
    """The 1-minute load average when it is above `cores`, else None."""
    return load_average[0] if load_average and cores and load_average[0] > cores else None


def compiled_after_warm_up(history):
    """{step: programs} of the timing windows past their shapes' warm-up steps in which the backend compiled (a
    window's compilations are counted at its first step), where the backend counts them: work that `compile_s`
    leaves out, and that slows the window's steps."""
    return {entry["step"]: entry["compilations"] for entry in history or ()
            if entry.get("compilations") and not entry.get("first_of_shape")}


ASIDE_FLAGS = ("host_sync_probe", "profiled")  # a `history` entry's marks of a step timed apart from the figures


def set_aside(entry):
    """Whether an entry of a run's `history` is a step timed apart: the host-sync probe's (slowed by the counting)
    or one of --profile's (slowed by the profiler)."""
    return any(entry.get(flag) for flag in ASIDE_FLAGS)


def is_steady(entry):
    """Whether an entry of a run's `history` (as the loop writes it) is a steady step: not a warm-up step of its
    shape, nor set aside (`set_aside`), and timed."""
    return not entry.get("first_of_shape") and not set_aside(entry) and entry.get("seconds") is not None


def steady_window_rows(history):
    """The steady timing windows of a run's `history`, one (seconds, steps, tokens) each: consecutive entries that
    are steady (`is_steady`), `window_steps` of them at a time (each entry holds its window's mean, so a window's
    seconds are its entries' sum). Results written before `window_steps` count each step as a window of its own."""
    windows, i = [], 0
    while i < len(history):
        entry = history[i]
        if not is_steady(entry):
            i += 1
            continue
        size = max(int(entry.get("window_steps") or 1), 1)
        members = [entry]
        while len(members) < size and i + len(members) < len(history):
            following = history[i + len(members)]
            if not is_steady(following):
                break
            members.append(following)
        windows.append((sum(m["seconds"] for m in members), len(members), sum(m.get("tokens") or 0 for m in members)))
        i += len(members)
    return windows


def run_warnings(result):
    """Why a run's timings may mislead, one sentence each (empty when none applies): a run that stopped early
    (interrupted, diverged), a run resumed (some figures its last process's), steady steps that scatter or were
    timed in too few windows, programs compiled after the warm-up steps, a machine loaded while the run trained
    (other processes used more than OTHERS_BOUND of its CPUs; where the OS does not tell, a load average above the
    cores as training began) or whose hypervisor took its CPUs, other processes holding a context on the run's GPUs
    (nvidia-smi's, as training began or ended), the task's quality warning, an extra's own (`extras_record[NAME]`'s
    `warning`), a sentencepiece vocabulary smaller than
    --vocab-size asked, a test set that overlaps the training data beyond TEST_OVERLAP_BOUND, an MFU above 100 % (its
    peak named) and an MFU peak measured while the load average was above the cores. Results written before the
    machine's load was recorded get no load warning."""
    warnings = []
    if result.get("status", "completed") != "completed":  # a partial result: its figures stop where it stopped
        done = last_step(result) or 0
        steps = (result.get("config") or {}).get("steps")
        warnings.append(f"{result['status']} after {done:,} of {f'{steps:,}' if steps else '?'} steps "
                        f"({result.get('status_reason') or 'no reason recorded'}): figures of a partial run")
    timing = result["timing"]
    median, p90 = timing.get("step_s_median"), timing.get("step_s_p90")
    if median and p90 and p90 / median > SCATTER_BOUND:
        warnings.append(f"steady steps scatter: p90 {p90 * 1000:,.1f} ms is {p90 / median:.2f}x the median "
                        f"{median * 1000:,.1f} ms (bound {SCATTER_BOUND:g}x)")
    resumed = timing.get("resumed_at_steps") or []
    if resumed:
        # A run stopped in its evaluation after training resumes past its last step, only to evaluate (a partial
        # run's resume may have ended before its first step).
        last = max((entry.get("step", 0) for entry in result.get("history") or []), default=0)
        completed = result.get("status", "completed") == "completed"
        during = [step for step in resumed if step <= last or not completed]
        said = ([f"resumed at step{'s' * (len(during) != 1)} {', '.join(f'{step:,}' for step in during)}"]
                if during else []) + ([f"resumed after the last step ({last:,}) to evaluate"]
                                      if len(during) < len(resumed) else [])
        warnings.append(f"{' and '.join(said)}: "
                        f"total time, cost, memory peaks and the compile cache are the last process's (train time "
                        f"and the steps are the whole run's)")
    windows = steady_window_rows(result.get("history") or [])
    if not windows and result["timing"].get("steady_steps") == 0:
        warnings.append("no steady step: every step trained was the first of its shape (or set aside), so neither "
                        "the step time, tokens/s nor the compilation apart from the steps is measured; give more "
                        "--steps")
    if 0 < len(windows) < MIN_STEADY_WINDOWS:
        steps = sum(count for _, count, _ in windows)
        warnings.append(f"few steady steps: {steps:,} step{'s' * (steps != 1)} in {len(windows)} timing window"
                        f"{'s' * (len(windows) != 1)} (bound {MIN_STEADY_WINDOWS}), too few for the median and p90 to "
                        f"show a spread; give more --steps or a smaller --timing-window")
    load = result.get("machine_load") or {}
    cores = load.get("cores") or result["env"].get("cpu_count")
    averages = {moment: (load.get(f"{moment}_training") or {}).get("load_average") for moment in ("before", "after")}
    others = load.get("other_processes_percent")
    if (others > OTHERS_BOUND) if others is not None else _loaded(averages["before"], cores):
        seen = ", ".join(f"{average[0]:g} {moment} training" for moment, average in averages.items() if average)
        used = "" if others is None else (f"other processes used {others:.0f} % of the CPUs' time while the run "
                                          f"trained (bound {OTHERS_BOUND:g} %); ")
        warnings.append(f"machine loaded: {used}load average {seen or 'not recorded'}, on {cores} cores")
    steal = load.get("steal_percent")
    if steal is not None and steal > STEAL_BOUND:
        warnings.append(f"the hypervisor took {steal:g} % of the CPUs' time while the run trained (steal; bound "
                        f"{STEAL_BOUND:g} %)")
    sharing = load.get("gpu_other_processes")
    if sharing:
        # nvidia-smi lists the processes that hold a context on a GPU, whether they compute or wait.
        warnings.append(f"GPU shared: {len(sharing)} other process{'es' * (len(sharing) != 1)} held a context on this "
                        f"run's GPU{'s' * ((result.get('devices_used') or 1) > 1)} as training began or ended "
                        f"({'; '.join(_gpu_process_text(process) for process in sharing[:3])}"
                        f"{f'; and {len(sharing) - 3} more' if len(sharing) > 3 else ''}): its times may be shared")
    late = compiled_after_warm_up(result.get("history"))
    if late:
        count, windows = sum(late.values()), ", ".join(f"{step:,}" for step in late)
        them = "them" if count != 1 else "it"
        warnings.append(f"{count} program{'s' * (count != 1)} compiled after the warm-up steps (in the timing "
                        f"window{'s' * (len(late) != 1)} from step {windows}): the compile time leaves {them} out, "
                        f"and the steps timed with {them} are slower")
    if (result.get("metrics") or {}).get("quality_warning"):  # the task's own (empty translations)
        warnings.append(result["metrics"]["quality_warning"])
    for name, record in (result.get("extras_record") or {}).items():  # an extra's own (fsdp sharding little)
        if isinstance(record, dict) and isinstance(record.get("warning"), str):
            warnings.append(f"extra '{name}': {record['warning']}")
    vocabulary = short_vocabulary_warning(result.get("data") or {})
    if vocabulary:
        warnings.append(vocabulary)
    overlap = overlapping_test_set_warning(result.get("data") or {})
    if overlap:
        warnings.append(overlap)
    utilization = result.get("utilization") or {}
    peak_load = _loaded(utilization.get("peak_load_average"), cores)
    peak_others = utilization.get("peak_other_processes_percent")  # absent from peaks measured before 2026-12-05
    peak_beside_others = (peak_others or 0) > OTHERS_BOUND
    if (utilization.get("mfu") or 0) > 1:  # said first: its peak's load is in `mfu_above_peak_warning`'s words
        warnings.append(mfu_above_peak_warning(utilization))
    elif utilization.get("mfu") is not None and (peak_load is not None or peak_beside_others):
        under = "; ".join(([f"other processes used {peak_others:.0f} % of the CPUs' time as it measured (bound "
                            f"{OTHERS_BOUND:g} %)"] if peak_beside_others else []) +
                          ([f"load average {peak_load:g} on {cores} cores"] if peak_load is not None else []))
        warnings.append(f"MFU peak measured under load: {under} at {utilization.get('peak_measured_at')}, so MFU "
                        f"reads high (`mtbench env --calibrate` on a quiet machine measures it again)")
    return warnings


def overlapping_test_set_warning(data):
    """A translation run's test set that is partly the training data (`data.test_sources_in_train` of
    `test_sources_checked`), past TEST_OVERLAP_BOUND, in words; None below it and where the task does not count
    it (a language model's contiguous splits, a plugin's task)."""
    overlapping, checked = data.get("test_sources_in_train"), data.get("test_sources_checked")
    if not checked or overlapping is None or overlapping / checked <= TEST_OVERLAP_BOUND:
        return None
    return (f"test set overlaps the training data: {overlapping:,} of {checked:,} test sources "
            f"({overlapping / checked:.0%}) are also training sources (bound {TEST_OVERLAP_BOUND:.0%}), so the test "
            f"scores reward recalling training pairs as well as translating")


def short_vocabulary_warning(data):
    """mtbench's sentencepiece vocabulary smaller than --vocab-size asked (`data.vocab_size_asked`), in words: the
    trainer takes what the training text supports, so the model's embedding and output layers are smaller than the
    configuration says; None where it learned as many pieces, or the run's tokenizer is not mtbench's own."""
    asked, learned = data.get("vocab_size_asked"), (data.get("tokenizer") or {}).get("vocab_size")
    if not asked or learned is None or learned >= asked:
        return None
    return f"vocabulary {learned:,} pieces where --vocab-size asked {asked:,}: the training text holds no more"


def flops_text(flops_per_s):
    """'97.1 GFLOP/s', '989.4 TFLOP/s': a CPU's peak in GFLOP/s, where TFLOP/s would read 0.10."""
    return f"{flops_per_s / 1e12:,.1f} TFLOP/s" if flops_per_s >= 1e12 else f"{flops_per_s / 1e9:,.1f} GFLOP/s"


def mfu_above_peak_warning(utilization):
    """An MFU above 100 % in words: the peak it divides by, where that peak came from and when it was measured,
    and how to measure it again. A peak measured on a busy machine and cached reads low for every later run (52
    GFLOP/s cached against 98 reached, 2026-11-26); a datasheet's peak beaten says the FLOPs counted are wrong."""
    devices = utilization.get("peak_devices") or 1
    peak = flops_text(utilization["peak_flops_per_s"]) + (f" x {devices} devices" if devices > 1 else "")
    source = utilization.get("peak_source") or "source not recorded"
    text = f"MFU above 100 % ({utilization['mfu'] * 100:.1f} %): more than the peak it divides by, {peak} ({source}"
    if not source.startswith("measured"):  # a datasheet's, which no measurement here replaces
        return text + "), so the model's FLOPs are counted too high or the peak is not this device's"
    measured = peak_measurement_text(utilization.get("peak_measured_at"), utilization.get("peak_load_average"),
                                     utilization.get("peak_cpus"), utilization.get("peak_threads"),
                                     utilization.get("peak_other_processes_percent"))
    return (f"{text}; {measured or 'when and under what load not recorded'}), so that peak is too low "
            f"(`mtbench env --calibrate` on a quiet machine measures it again)")


def peak_measurement_text(measured_at, load_average, cpus=None, threads=None, other_processes_percent=None):
    """When a measured MFU peak was measured, how busy the host was and on how many CPUs and threads (where
    recorded): 'measured 2026-11-22T10:04:31+00:00 at load average 0.42 / 0.3 / 0.25 on 2 CPUs, 2 threads, other
    processes 1 % of the CPUs'; None for a datasheet peak or one cached before measurements kept their time."""
    if not measured_at:
        return None
    load = " / ".join(f"{value:g}" for value in load_average) if load_average else "unknown"
    on = f" on {cpus} CPU{'s' * (cpus != 1)}" if cpus else ""
    on += f", {threads} thread{'s' * (threads != 1)}" if cpus and threads else ""
    if other_processes_percent is not None:
        on += f", other processes {other_processes_percent:.0f} % of the CPUs"
    return f"measured {measured_at} at load average {load}{on}"


def share_text(part, whole):
    """'512 of 201,451 (0.25 %)', '(the whole split)' where `part` is all of it; `part` alone where the whole is not
    recorded."""
    if not whole:
        return f"{part:,}"
    share = "the whole split" if part == whole else f"{100 * part / whole:.2f} %" if part >= whole / 10_000 \
        else "under 0.01 %"
    return f"{part:,} of {whole:,} ({share})"


def split_scored_text(result, split="test"):
    """How much of a language model's `split` its figures cover, as `scored_sentences_text` says of translation's
    test set: 'bytes scored: 512 of 201,451 (0.25 %); tokens 128 of 50,362 (0.25 %)', from the metrics' counts
    and the split's size (`data.bytes`, `data.tokens`); the tokens only where they differ from the bytes (not of a
    byte tokenizer), alone where its bytes are not known (token files without them). None for another task, or
    where the split was not scored (--measure-only)."""
    metrics, data = result.get("metrics") or {}, result.get("data") or {}
    counts = [(unit, metrics.get(f"{split}_{unit}_evaluated"), (data.get(unit) or {}).get(split))
              for unit in ("bytes", "tokens")]
    counts = [(unit, part, whole) for unit, part, whole in counts if part is not None]
    if not counts:
        return None
    (unit, part, whole), *others = counts
    others = [(other, n, of) for other, n, of in others if (n, of) != (part, whole)]
    return f"{unit} scored: {share_text(part, whole)}" + "".join(f"; {other} {share_text(n, of)}"
                                                               for other, n, of in others)


def scored_sentences_text(result):
    """How many test sentences the scores cover, and why the others were left out: '370 of 500 (130 longer than
    --max-len 48)'; None before the test set was translated."""
    scored = result["metrics"].get("test_sentences_scored")
    if scored is None:
        return None
    data = result["data"]
    dropped = {reason: (counts or {}).get("test", 0) for reason, counts in (data.get("dropped") or {}).items()}
    dropped.setdefault("too_long", (data.get("dropped_too_long") or {}).get("test", 0))
    total = scored + sum(dropped.values())
    if total == scored:
        return f"{scored} (the whole test set)"
    reasons = {"too_long": f"longer than --max-len {result['config'].get('max_len')}",
               "empty_side": "with an empty side", "duplicate": "duplicates"}
    left_out = ", ".join(f"{count} {reasons.get(reason, reason)}" for reason, count in dropped.items() if count)
    return f"{scored} of {total} ({left_out})"


# The size flags a run may set over its preset, in the order labels list them (configuration keys; the flag is
# the key with dashes).
SIZE_KEYS = ("layers", "encoder_layers", "decoder_layers", "d_model", "heads", "ff_dim", "dropout")


def size_label(sizes):
    """'d-model=128,layers=2' of {configuration key: value}, in SIZE_KEYS order; '' when nothing is set."""
    return ",".join(f"{key.replace('_', '-')}={sizes[key]:g}" for key in SIZE_KEYS if sizes.get(key) is not None)


DEFAULT_MODEL = "transformer"  # the model family of a run without --model


def model_label(config):
    """'model=NAME' for a run of another model family than mtbench's Transformer (its path left out), '' for the
    Transformer and for results written before `--model` existed."""
    name = (config.get("model_name") or DEFAULT_MODEL).partition(":")[0]
    return "" if name == DEFAULT_MODEL else f"model={name}"


def run_name(backend, extras, sizes, processes=1, settings=()):
    """'backend+extra+extra', '@N' for a run of N processes, then ':flag=value,...' for `model=NAME` of another
    model family than the Transformer and the size flags set in `sizes` (a configuration), and the (flag, value)
    pairs of `settings` after them (what a sweep varies beside the size: 'batch-size', 'max-len', 'max-tokens';
    'python', the environment a run came from)."""
    label = "+".join([backend, *extras])
    if processes > 1:
        label += f"@{processes}"
    keys = [model_label(sizes), size_label(sizes),
            *(f"{flag}={value:g}" if isinstance(value, float) else f"{flag}={value}" for flag, value in settings)]
    keys = ",".join(key for key in keys if key)
    return f"{label}:{keys}" if keys else label


def run_processes(result):
    """How many processes trained the run (results from before several processes existed: one)."""
    return (result.get("processes") or {}).get("world_size", 1)


def batch_text(config):
    """A run's batch as its configuration sizes it: rows ('64'), or tokens ('4,096 tokens', --max-tokens), times
    its micro-batches ('64 x 2 micro-batches', --grad-accum); 'per run' where a comparison sweeps it."""
    tokens = config.get("max_tokens")
    batch = f"{tokens:,} tokens" if tokens else str(config.get("batch_size", "per run"))
    micro_batches = config.get("grad_accum") or 1
    return batch + (f" x {micro_batches} micro-batches" if micro_batches > 1 else "")


def run_label(result):
    """The name of a result's run in every output, and how `--matrix` and `--baseline` name it (`run_name`)."""
    return run_name(result["backend"], result["extras"], result["config"], run_processes(result))


def run_dtype(result):
    """The dtype policy the model really ran with (an extra may set one), else the one asked for."""
    return result["model"].get("dtype_policy") or result["config"]["dtype"]


# The accelerator software under a run's figures: a CUDA runtime, cuDNN or ROCm of another version runs other kernels.
ACCELERATOR_SOFTWARE = (("cuda_version", "CUDA"), ("rocm_version", "ROCm"), ("cudnn_version", "cuDNN"))


def versions_text(result, with_mtbench=True):
    """'jax 0.10.2, jaxlib 0.10.2, keras 3.15.1, python 3.11.7, CUDA 12.8, cuDNN 9.8.0, NVIDIA driver 570.86.15,
    mtbench 0.1.0 (git 0123456789ab-dirty)': the software a run trained with. The accelerator's only where the run
    computed on one (a CUDA build of torch timing the CPU runs no CUDA); mtbench's own and its commit where
    `with_mtbench` (a table with a commit column of its own leaves them out)."""
    env = result["env"]
    parts = [f"{name} {version}" for name, version in (env.get("backend_versions") or {}).items()]
    parts.append(f"keras {env['keras']}")
    if env.get("python"):
        parts.append(f"python {env['python']}")
    if (env.get("device") or {}).get("kind") not in (None, "cpu"):
        parts += [f"{name} {env[key]}" for key, name in ACCELERATOR_SOFTWARE if env.get(key)]
        if env.get("cuda_version") and env.get("nvidia_driver_version"):
            parts.append(f"NVIDIA driver {env['nvidia_driver_version']}")
    if with_mtbench and env.get("mtbench"):
        parts.append(mtbench_text(env))
    return ", ".join(parts)


def mtbench_text(env):
    """'mtbench 0.1.0 (git 0123456789ab-dirty)': the mtbench code of a run's `env` ('?' for a version not recorded)."""
    commit = env.get("mtbench_git_commit")
    return f"mtbench {env.get('mtbench') or '?'}" + (f" (git {short_commit(commit)})" if commit else "")


def short_commit(commit):
    """A git commit as people quote it: its first 12 hex digits, '-dirty' kept (the tree had uncommitted changes)."""
    sha, dirty, _ = commit.partition("-dirty")
    return sha[:12] + ("-dirty" if dirty else "")


def hardware(result):
    """What the run computed on: a CPU's model and the machine's cores; an accelerator's name and how many of them
    the run trained on (`devices_used`). Not the backend's `device_info()['count']`, which counts other things on
    the two backends: torch every GPU the process sees, JAX every device of a run of several processes, so that one
    GPU of a machine of eight read '8x', and JAX's two processes '2x' where torch's read '8x'."""
    env = result["env"]
    device = env["device"]
    if device.get("kind") == "cpu":
        # The machine's cores: a process beside others on it counts only its share (`processes.cpu_share`).
        share = (result.get("processes") or {}).get("cpu_share")
        cores = share["of_cpus"] if share else env.get("cpu_count")
        quota = env.get("cpu_quota")  # a control group's share of their time (a container's --cpus)
        limited = f" (a quota of {quota:g} CPUs)" if quota is not None and cores and quota < cores else ""
        return f"{device.get('name')}, {cores} core{'' if cores == 1 else 's'}{limited}"
    return f"{result.get('devices_used') or device.get('count')}x {device.get('name')}"


def machine_device(result):
    """The kind of machine a run computed on, whatever share of it: a CPU's model and cores (`hardware`), an
    accelerator's kind and name. Runs of one device and of several compare on it (scaling efficiency)."""
    device = result["env"]["device"]
    return hardware(result) if device.get("kind") == "cpu" else f"{device.get('kind')} {device.get('name')}"
