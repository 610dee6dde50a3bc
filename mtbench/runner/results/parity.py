"""The parity check: runs that start from the same weights and see the same batches must follow the same
training-loss curve, apart from float rounding. A run that does not is not measuring the same computation,
and its timings do not compare.

Only runs with the same dtype policy are held to it: bfloat16 and float32 curves part by design. Runs of a 16-bit
policy are held to the means of their losses over windows of `SIXTEEN_BIT_WINDOW` steps rather than to each
step's: the same arithmetic in 16 bits agrees for a dozen steps and then parts step by step (each step's rounding,
amplified by training), while the curve stays. Means forgive other arithmetic too, so their first
`EARLY_STEPS` steps, before rounding has grown, are held step by step to a quarter of the tolerance. Within each
dtype, every run is checked against the first run of
that dtype (the baseline where it has that dtype). Runs that train with dropout are held only to runs that draw
the same masks (`same_draws`): the same backend, train step, processes and dropout, and extras that differ only by
those that keep every draw (`Extra.keeps_random_draws`: remat, tensor-parallel), whose processes draw one process's
masks. Each framework, and each step kind, draws its own masks, so other curves part from the first step
(`--dropout 0` makes a run checkable against them).
"""

import math
from dataclasses import asdict, dataclass, field

from mtbench.errors import MtbenchError, RunFailure
from mtbench.figures import run_dtype

PARITY_STEPS = 50
# The gate where --parity-tolerance is not given, by the dtype policy of the runs held to it. 16-bit runs of the same
# arithmetic part by up to 0.66 % step by step on an H100 (below): their window means are held to 1 %. float32 runs
# of jax and torch, in one process or split over processes, agree within 1e-4 % over 50 steps on a CPU; 0.1 % keeps
# a margin for a GPU's other kernels and reduction orders, where 1 % let a run of other float32 arithmetic pass.
PARITY_TOLERANCE = 0.01  # 16-bit dtype policies
FLOAT32_PARITY_TOLERANCE = 0.001


def check_parity_options(steps, tolerance):
    """Refuses --parity-steps and --parity-tolerance that no check could use (`compare` and `report` take both);
    a tolerance of None is each dtype's default (`default_tolerance`)."""
    for option, problem in (("--parity-steps", parity_steps_problem(steps)),
                            ("--parity-tolerance", parity_tolerance_problem(tolerance))):
        if problem:
            raise MtbenchError(f"{option} {problem}")


def parity_steps_problem(steps):
    """Why `steps` is no number of steps a parity check could compare ('must be at least 1, got 0'), or None: the
    options' and a compare JSON's record's alike (`report.compare_record_problem`)."""
    if isinstance(steps, bool) or not isinstance(steps, int):
        return f"must be a whole number of steps, got {steps!r}"
    return f"must be at least 1, got {steps}" if steps < 1 else None


def parity_tolerance_problem(tolerance):
    """Why `tolerance` is no gate a parity check could hold runs to, or None (None: each dtype's default)."""
    if tolerance is None:
        return None
    # inf held every run within it: no check at all
    if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not 0 < tolerance < math.inf:
        return f"must be a positive finite number, got {tolerance!r}"
    return None
# On an H100 (2026-11-27, GPT-2 small, mixed bfloat16, 50 steps) two runs of one JAX step parted by 0.66 % at step
# 30, and hand-written JAX from it by 1.4 % at step 35; their 10-step means by 0.11 % and 0.30 %, where torch.compile
# keeping float32 between fused operations (other arithmetic) parted by 0.68 %.
SIXTEEN_BIT_WINDOW = 10
# The same H100 runs' first steps: rows of the same arithmetic (cuDNN's, FlashAttention's and XLA's kernels among
# them) within 0.04 % at step 3, torch.compile's float32 intermediates 0.47 % from them; torch eager and JAX with
# the unfused attention (2026-11-26) within 0.13 % over 100 steps.
EARLY_STEPS = 5
EARLY_SHARE = 0.25  # of the tolerance


def early_tolerance(tolerance):
    return tolerance * EARLY_SHARE


def default_tolerance(dtype):
    """The gate of runs of dtype policy `dtype` where --parity-tolerance is not given."""
    return PARITY_TOLERANCE if "16" in str(dtype) else FLOAT32_PARITY_TOLERANCE


def parity_window(dtype):
    """Steps whose mean loss one parity comparison holds: SIXTEEN_BIT_WINDOW for a 16-bit dtype policy, else 1."""
    return SIXTEEN_BIT_WINDOW if "16" in str(dtype) else 1


@dataclass
class ParityPair:
    reference: str
    run: str
    dtype: str
    steps: int
    max_relative_difference: float
    at_step: int
    within_tolerance: bool
    # The first step where one run's loss is null (not finite: it diverged) and the other's is not; steps from
    # there on are not compared, and the pair is not within tolerance. None when both curves have every loss.
    diverged_at: int = None
    diverged_run: str = None
    # The steps whose mean loss is compared (`parity_window`); `at_step` is then the last step of the worst window.
    window: int = 1
    # Held over windows, the first steps are also held step by step to `early_tolerance`: the largest relative
    # difference among them and its step (None where the pair is held step by step throughout).
    early_steps: int = 0
    early_max_relative_difference: float = None
    early_at_step: int = None
    early_tolerance: float = None
    # The largest relative difference the pair may show: --parity-tolerance, or its dtype's `default_tolerance`.
    tolerance: float = PARITY_TOLERANCE

    def where(self):
        """'at step 7', or for means over windows 'in steps 21-30 (10-step means)'."""
        if self.window == 1:
            return f"at step {self.at_step}"
        return f"in steps {max(self.at_step - self.window + 1, 1)}-{self.at_step} ({self.window}-step means)"

    @property
    def curve_within(self):
        """Whether the curves (steps or windows) stay within the tolerance and neither diverged alone."""
        return self.max_relative_difference <= self.tolerance and self.diverged_at is None

    @property
    def early_within(self):
        return self.early_max_relative_difference is None or \
            self.early_max_relative_difference <= self.early_tolerance

    def early_text(self):
        """'; steps 1-5 step by step: 0.04 % at step 3, within 0.25 %', or '' where there is no such check."""
        if self.early_max_relative_difference is None:
            return ""
        verdict = "within" if self.early_within else "NOT within"
        difference = percent_beside(self.early_max_relative_difference, self.early_tolerance)
        return (f"; steps 1-{self.early_steps} step by step: {difference} at step {self.early_at_step}, {verdict} "
                f"{percent(self.early_tolerance)}")


@dataclass
class ParityReport:
    steps: int
    tolerance: float  # --parity-tolerance, or None: each pair's dtype's default (the pairs say theirs)
    pairs: list = field(default_factory=list)
    unchecked: list = field(default_factory=list)  # [run name, why it was held to nothing]

    @property
    def failures(self):
        return [pair for pair in self.pairs if not pair.within_tolerance]

    @property
    def largest(self):
        return max(self.pairs, key=lambda pair: pair.max_relative_difference, default=None)

    def to_dict(self):
        # Null where no pair was held to anything: a check that compared nothing passed nothing.
        return {"steps": self.steps, "tolerance": self.tolerance, "passed": not self.failures if self.pairs else None,
                "max_relative_difference": self.largest.max_relative_difference if self.pairs else None,
                "pairs": [asdict(pair) for pair in self.pairs], "unchecked": self.unchecked}

    def lines(self):
        """One sentence per checked pair and per run held to nothing, for terminals and READMEs."""
        lines = []
        for pair in self.pairs:
            difference = percent_beside(pair.max_relative_difference, pair.tolerance)
            if pair.diverged_at is not None:
                before = pair.diverged_at - 1
                lines.append(f"parity {pair.run} vs {pair.reference} ({pair.dtype}): {pair.diverged_run}'s loss is "
                             f"not finite from step {pair.diverged_at}, the other's is; over the {before} "
                             f"step{'s' * (before != 1)} before, largest relative loss difference {difference}, NOT "
                             f"within {percent(pair.tolerance)}")
                continue
            verdict = "within" if pair.curve_within else "NOT within"
            lines.append(f"parity {pair.run} vs {pair.reference} ({pair.dtype}, first {pair.steps} "
                         f"step{'s' * (pair.steps != 1)}): "
                         f"largest relative loss difference {difference} {pair.where()}, "
                         f"{verdict} {percent(pair.tolerance)}{pair.early_text()}")
        lines.extend(f"parity {name}: not checked, {why}" for name, why in self.unchecked)
        return lines


def percent(fraction):
    """Two significant digits, however small: parity differences are often millionths."""
    return f"{fraction * 100:.2g} %"


def percent_beside(fraction, bound):
    """`fraction` as `percent` writes it, with more digits where two would write it as `bound` is written although
    it differs: '1.004 %, NOT within 1 %', not '1 %, NOT within 1 %'."""
    text = percent(fraction)
    for digits in range(3, 8):
        if text != percent(bound) or fraction == bound:
            break
        text = f"{fraction * 100:.{digits}g} %"
    return text


def loss_curve(result, steps):
    return [entry["loss"] for entry in result["history"][:steps]]


def finite_steps(reference, run):
    """How many steps, from the first, both curves have a loss for (a diverged run writes its non-finite loss as
    null): the steps a pair's figures compare."""
    count = 0
    for expected, actual in zip(reference, run):
        if expected is None or actual is None:
            break
        count += 1
    return count


def compare_curves(reference, run, window=1):
    """(largest |run - reference| / |reference|, the 1-based step where it occurs) over their common steps, up to
    the first step where a loss is null (a diverged run writes its non-finite loss as null). With `window` > 1 the
    curves' means over consecutive windows of that many steps are compared (a last, shorter window too), and the
    step is the last of the worst window."""
    common = list(zip(reference, run))[:finite_steps(reference, run)]
    worst, at_step = 0.0, 1
    for start in range(0, len(common), window):
        pairs = common[start:start + window]
        expected = sum(pair[0] for pair in pairs) / len(pairs)
        actual = sum(pair[1] for pair in pairs) / len(pairs)
        difference = abs(actual - expected) / max(abs(expected), 1e-12)
        if difference > worst or difference != difference:  # NaN is the worst difference of all
            worst, at_step = difference, start + len(pairs)
    return worst, at_step


def first_lone_null(reference, run, reference_name, name):
    """(the first 1-based step where exactly one curve's loss is null, the name of that run), or (None, None).
    Both null at the same step: both diverged there, as the same computation would."""
    for step, (expected, actual) in enumerate(zip(reference, run), start=1):
        if (expected is None) != (actual is None):
            return step, reference_name if expected is None else name
        if expected is None:
            break
    return None, None


# How a step is laid out where that changes the masks it draws: each micro-batch draws its own (--grad-accum, the
# pipeline's), and a data axis's replicas theirs (its size follows the model axis and the stages).
DRAW_LAYOUT_KEYS = ("grad_accum", "pipeline_micro_batches", "tensor_parallel_size", "pipeline_parallel_size")


def same_draws(result):
    """What decides the dropout masks a run draws, as a key two runs that draw the same masks share: None for a run
    without dropout; else its dropout, backend, train step, process count, the extras that change draws and the
    layout of its steps that does (`DRAW_LAYOUT_KEYS`)."""
    dropout = (result.get("model") or {}).get("dropout") or 0.0
    if dropout <= 0:
        return None
    keeping = set(result.get("extras_keeping_draws") or ())
    config = result.get("config") or {}
    processes = result.get("processes") or {}
    # Processes joined by extras that keep every draw (tensor-parallel's model axis) draw one process's masks.
    spanned_by = processes.get("spanned_by")
    joined_alike = bool(spanned_by) and set(spanned_by) <= keeping
    return (dropout, result.get("backend"), result.get("train_step"),
            1 if joined_alike else processes.get("world_size", 1),
            tuple(sorted(extra for extra in result.get("extras") or () if extra not in keeping)),
            tuple((config.get(key) or 1) for key in DRAW_LAYOUT_KEYS))


def check_parity(named_runs, dtype_of, steps=PARITY_STEPS, tolerance=None):
    """`named_runs`: [(name, result)], the baseline first. `dtype_of(result)` names the runs held to one curve: the
    run's dtype policy, and what else they must share ('float32, batch-size=16'); the policy itself, not that
    name, says whether a 16-bit run is held over windows and, where `tolerance` is None, to what."""
    report = ParityReport(steps=steps, tolerance=tolerance)
    reference_by_dtype = {}
    runs_by_dtype = {}
    for name, result in named_runs:
        draws = same_draws(result)
        dtype = dtype_of(result)
        # Runs with dropout are compared among those that draw their masks alike, apart from the others.
        group = dtype if draws is None else (dtype, draws)
        runs_by_dtype.setdefault(group, []).append(name)
        if group not in reference_by_dtype:
            reference_by_dtype[group] = (name, result)
            continue
        reference_name, reference = reference_by_dtype[group]
        common = min(steps, len(reference["history"]), len(result["history"]))
        if common == 0:
            report.unchecked.append([name, "no training steps to compare"])
            continue
        reference_curve, curve = loss_curve(reference, common), loss_curve(result, common)
        policy = run_dtype(result)
        window = parity_window(policy)
        worst, at_step = compare_curves(reference_curve, curve, window)
        diverged_at, diverged_run = first_lone_null(reference_curve, curve, reference_name, name)
        common = finite_steps(reference_curve, curve)  # the steps compared: those before either loss is null
        if diverged_at is None and common == 0:  # both diverged at step 1
            report.unchecked.append([name, f"no finite loss to compare: it and {reference_name} both diverged "
                                           f"at step 1"])
            continue
        pair = ParityPair(reference_name, name, dtype, common, worst, at_step, within_tolerance=False,
                          diverged_at=diverged_at, diverged_run=diverged_run, window=window,
                          tolerance=default_tolerance(policy) if tolerance is None else tolerance)
        if window > 1:
            pair.early_steps = min(EARLY_STEPS, common)
            pair.early_max_relative_difference, pair.early_at_step = compare_curves(
                reference_curve[:pair.early_steps], curve[:pair.early_steps])
            pair.early_tolerance = early_tolerance(pair.tolerance)
        pair.within_tolerance = pair.curve_within and pair.early_within
        report.pairs.append(pair)
    for group, (name, _) in reference_by_dtype.items():
        dropout_group = isinstance(group, tuple)
        # Runs of the same dtype whose masks are drawn otherwise (another backend's): never held to this group.
        apart = [other_name for other, (other_name, _) in reference_by_dtype.items()
                 if dropout_group and other != group and (other[0] if isinstance(other, tuple) else other) == group[0]]
        held = runs_by_dtype[group][1:]
        if held and not apart:
            continue
        if dropout_group and held:
            report.unchecked.append([name, f"it trains with dropout {group[1][0]:g}: held to {', '.join(held)} "
                                           f"only, which draw its masks, not to {', '.join(apart)}, whose masks are "
                                           f"drawn otherwise (--dropout 0 makes them checkable)"])
        elif dropout_group:
            report.unchecked.append([name, f"it trains with dropout {group[1][0]:g}, whose masks only runs of its "
                                           f"backend, step, processes and micro-batches draw alike, and no other "
                                           f"here does (--dropout 0 makes it checkable)"])
        else:
            report.unchecked.append([name, f"no other {group} run to compare with"])
    return report


def require_parity(comparison, out):
    """A comparison whose runs failed the parity check ends with status 1 (after its figures were shown and
    written): its timings compare different computations."""
    failures = comparison.parity.failures
    if failures and all(pair.curve_within for pair in failures):  # first steps alone
        pair = max(failures, key=lambda pair: pair.early_max_relative_difference)
        raise RunFailure(f"parity check failed: {pair.run} differs from {pair.reference} by "
                         f"{percent_beside(pair.early_max_relative_difference, pair.early_tolerance)} at step "
                         f"{pair.early_at_step} (more than {percent(pair.early_tolerance)}, step by step over the "
                         f"first {pair.early_steps}); results kept in {out}")
    if failures:
        worst = max(failures, key=lambda pair: pair.max_relative_difference)
        raise RunFailure(f"parity check failed: {worst.run} differs from {worst.reference} by up to "
                         f"{percent_beside(worst.max_relative_difference, worst.tolerance)} (more than "
                         f"{percent(worst.tolerance)}) over the first {worst.steps} "
                         f"step{'s' * (worst.steps != 1)}; "
                         f"results kept in {out}")
