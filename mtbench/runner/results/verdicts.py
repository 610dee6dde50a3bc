"""Verdicts with their uncertainty: pure functions on numbers, no framework and no I/O.

- `ratio_interval`: the ratio of a timing figure of two runs (tokens/s, steady step time, compile time, ...) with a
  95 % interval of the log ratio, from the spread between the runs' repeats: Student's t over the differences of
  paired repeats where the runs were interleaved (repeat k of one beside repeat k of the other), else Welch's over
  the two runs' repeats. Where each run is one repeat, only the spread within it is known: a bootstrap of its
  steady timing windows, which leaves out the noise between runs, so that no difference is called from it.
- `verdict`: the interval in words ('torch is 1.23x faster than jax in tokens/s (1.19–1.27)'), where a difference
  that is not beyond the interval or not beyond the noise floor is 'no difference beyond the noise', and one of
  a single repeat each 'undetermined' (`undetermined_reason`); a run that
  trained on a loaded machine (`loaded_runs`) is named on it as not reliable.
- `noise_floor_of`: how far from 1 an A/A ratio (the same configuration twice) strays: the machine's noise floor.
- `break_even`: after how many steps (tokens, where the runs' steps differ in work) a run that steps faster
  overtakes one that compiles faster.
- `target_times`: time to the target quality with and without compilation.

The method and its assumptions are described in docs/results.md ("Verdicts and their intervals"). The bootstrap
draws from a generator of fixed seed, so the same results always give the same intervals.
"""

import math
import re
from dataclasses import asdict, dataclass
from datetime import datetime

import numpy as np

from mtbench.figures import FIGURES_BY_KEY, is_steady, run_warnings, set_aside, steady_window_rows
from mtbench.runner.loop.timing import compile_seconds
from mtbench.runner.results.parity import PARITY_STEPS, check_parity, percent

CONFIDENCE = 0.95
RESAMPLES = 2000
SEED = 30  # fixed: the same results give the same intervals, run after run
# Fewer repeats than this, and the interval rests on a spread estimated from a handful of runs (wide, as Student's t
# makes it, and only as good as the assumption that the runs' logs scatter normally).
MIN_REPEATS = 5
# Fewer steady timing windows in a run than this, and the bootstrap within it has too few to resample.
MIN_WINDOWS = 10
# Fewer repeats than this, and Student's t has 1 degree of freedom: 12.71 standard errors each side, an interval
# of one run's figure that spans from nothing to minutes (0.1-1,146,099 ms of repeats at 152 and 552 ms).
MIN_T_REPEATS = 3
DEFAULT_WIDTH = 0.03  # --repeats auto: until every interval lies within +-3 % of its ratio
# The figures whose interval counts the windows within each run: (how a repeat's windows give the figure,
# whether a higher value is faster).
WINDOW_FIGURES = {"tokens_per_s": ("tokens over seconds", True), "step_s_median": ("median step", False)}
# Timing figures where a higher value is faster; every other timing figure is a time (lower is faster).
HIGHER_IS_FASTER = {"tokens_per_s", "mfu", "mfu_real_tokens"}
SPEED_FIGURE = "tokens_per_s"  # what "faster" and "slower" of a run mean: a regression gate judges it
# The run warnings (`run_warnings`) that say other work shared the machine as a run trained: its CPUs (other
# processes, the hypervisor's other guests) or its GPU. A burst of it lands on one run of a comparison, and an
# interval from the repeats' spread cannot tell it from the run's own speed (an initialisation read 12x slower).
LOAD_WARNINGS = ("machine loaded", "the hypervisor took", "GPU shared")


def steady_windows(history):
    """The steady timing windows of a run's `history` (`steady_window_rows`), as an array of rows (seconds, steps,
    tokens)."""
    return np.array(steady_window_rows(history), dtype=float).reshape(-1, 3)


def window_figure(key, windows):
    """A window figure of one run's windows: tokens/s (tokens over seconds) or the median step time over the
    steps, each step its window's mean (as `timing.step_s_median` counts them, np.median's mean of the middle two
    where the steps are even): a window of 10 steps weighs 10 times one of a single step, whose time holds a
    synchronisation of its own."""
    if key == "tokens_per_s":
        return windows[:, 2].sum() / windows[:, 0].sum()
    # The run's own median, not the lower one: a report's table shows `timing.step_s_median`, and its interval, the
    # JSON's and the gate's figure must have that one centre (the lower median put 524.4 ms beside its 551.6 ms).
    return float(_median_step(windows, np.ones((1, len(windows))))[0])


def _median_step(windows, counts):
    """The median step time over the steps of `windows` drawn `counts` times each (one row of counts a draw),
    each step its window's mean, the mean of the middle two where a draw's steps are even: one median a row."""
    per_step = windows[:, 0] / windows[:, 1]
    order = np.argsort(per_step)
    below = np.cumsum(counts[:, order] * windows[order, 1], axis=1)
    total = below[:, -1:]
    lower = per_step[order][np.argmax(below >= (total + 1) // 2, axis=1)]
    upper = per_step[order][np.argmax(below >= total // 2 + 1, axis=1)]
    return (lower + upper) / 2


def _resampled_window_figure(key, windows, rng, resamples):
    """The figure of `resamples` bootstrap resamples of a run's windows (drawn with replacement, as many as it
    has), as an array; in chunks, so that a long run's windows never fill the memory."""
    count = len(windows)
    out = np.empty(resamples)
    chunk = max(1, 2_000_000 // max(count, 1))
    for start in range(0, resamples, chunk):
        n = min(chunk, resamples - start)
        counts = rng.multinomial(count, np.full(count, 1.0 / count), size=n)
        if key == "tokens_per_s":
            out[start:start + n] = (counts @ windows[:, 2]) / (counts @ windows[:, 0])
        else:
            out[start:start + n] = _median_step(windows, counts)
    return out


def _window_sides(results):
    """The steady windows of each repeat that has any."""
    return [w for w in (steady_windows(r["history"]) for r in results) if len(w)]


def figure_point(key, results):
    """Figure `key` of one run's repeats as `ratio_interval` takes it: the geometric mean over the repeats of each
    one's figure (a window figure's of its steady windows, `WINDOW_FIGURES`); None where no repeat has it, or where
    one measured 0 (a ratio to it has no bound)."""
    if key in WINDOW_FIGURES:
        side = _window_sides(results)
        logs = _log_values([window_figure(key, w) for w in side]) if side else None
    else:
        logs = _log_values([FIGURES_BY_KEY[key].value(result) for result in results])
    return float(math.exp(logs.mean())) if logs is not None and len(logs) else None


def figure_interval(key, results, resamples=RESAMPLES, seed=SEED, confidence=CONFIDENCE):
    """(value, low, high) of a window figure (`WINDOW_FIGURES`) of one run's repeats: the geometric mean over
    the repeats of each one's figure (of one repeat, its figure: `timing.step_s_median` or `tokens_per_s`), with
    its 95 % interval as `ratio_interval` draws one (Student's t over the repeats; one repeat: a bootstrap of its
    windows); low and high None where `figure_interval_gap` says why none is stated; None where no repeat has a
    steady window, or where one repeat's figure is 0."""
    side = _window_sides(results)
    points = _log_values([window_figure(key, w) for w in side]) if side else None
    if points is None:  # no steady window, or a repeat's figure 0 (no tokens recorded): no ratio to it
        return None
    point = points.mean()
    if _interval_gap(side) is not None:
        return float(math.exp(point)), None, None
    if len(points) > 1:
        low, high = mean_interval(points, confidence)
    else:
        resampled = _resampled_window_figure(key, side[0], np.random.default_rng(seed), resamples)
        tail = (1 - confidence) / 2 * 100
        low, high = np.percentile(np.log(resampled), [tail, 100 - tail])
    return float(math.exp(point)), float(math.exp(min(low, point))), float(math.exp(max(high, point)))


def figure_interval_gap(results):
    """Why `figure_interval` states no interval of one run's repeats, or None where it states one: a single
    repeat of fewer than `MIN_WINDOWS` steady windows (a bootstrap of 2 windows spans their two values, and of one
    has nothing to resample), or fewer than `MIN_T_REPEATS` repeats (Student's t of 1 degree of freedom)."""
    return _interval_gap(_window_sides(results))


def _interval_gap(side):
    """`figure_interval_gap` of the repeats' steady windows (`_window_sides`)."""
    if len(side) == 1 and len(side[0]) < MIN_WINDOWS:
        return few_windows_text(len(side[0]))
    if 1 < len(side) < MIN_T_REPEATS:
        df = len(side) - 1
        return (f"{len(side)} repeats: Student's t of {df} degree{'s' if df > 1 else ''} of freedom "
                f"({t_quantile(1 - (1 - CONFIDENCE) / 2, df):.2f} standard errors each side) makes the interval too "
                f"wide to state (at least {MIN_T_REPEATS} repeats)")
    return None


def few_windows_text(windows):
    return (f"{windows} steady timing window{'s' if windows != 1 else ''} in a run: too few to resample (at least "
            f"{MIN_WINDOWS}: more --steps, or a smaller --timing-window)")


def t_quantile(probability, df):
    """Student's t distribution's quantile for `df` degrees of freedom (any positive number: Welch's are
    fractional), `probability` above 0.5: the t that the distribution's function reaches there, by bisection."""
    low, high = 0.0, 1.0
    while t_distribution(high, df) < probability:
        low, high = high, high * 2
    for _ in range(200):
        middle = (low + high) / 2
        low, high = (middle, high) if t_distribution(middle, df) < probability else (low, middle)
    return (low + high) / 2


def t_distribution(t, df):
    """P(T <= t) for Student's t with `df` degrees of freedom, t >= 0: 1 - I_x(df/2, 1/2) / 2, x = df / (df + t^2),
    the regularized incomplete beta function."""
    return 1 - _regularized_beta(df / (df + t * t), df / 2, 0.5) / 2


def _regularized_beta(x, a, b):
    """I_x(a, b), from its continued fraction (modified Lentz), on the side of x where it converges fast."""
    if x <= 0 or x >= 1:
        return float(x >= 1)
    front = math.exp(math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x))
    if x > (a + 1) / (a + b + 2):
        return 1 - _regularized_beta(1 - x, b, a)
    tiny = 1e-300
    c, d = 1.0, 1 - (a + b) * x / (a + 1)
    d = 1 / (d if abs(d) > tiny else tiny)
    fraction = d
    for m in range(1, 500):
        for numerator in (m * (b - m) * x / ((a + 2 * m - 1) * (a + 2 * m)),
                          -(a + m) * (a + b + m) * x / ((a + 2 * m) * (a + 2 * m + 1))):
            d = 1 + numerator * d
            d = 1 / (d if abs(d) > tiny else tiny)
            c = 1 + numerator / c
            c = c if abs(c) > tiny else tiny
            fraction *= c * d
        if abs(c * d - 1) < 1e-15:
            break
    return front * fraction / a


def repeats_interval(points, paired, confidence=CONFIDENCE):
    """(low, high) of the difference of the mean logs of two runs' repeats (`points`: the candidate's, the
    reference's), from the spread between repeats, or None where no repeat has another to show it. Paired (as many,
    interleaved): Student's t over the differences, n - 1 degrees of freedom. Else Welch's, each run's own spread,
    Welch-Satterthwaite's degrees of freedom; where one run is a single repeat, the other's spread stands for both
    (they ran on one machine), its degrees of freedom alone."""
    candidate, reference = points
    if paired:
        return mean_interval(candidate - reference, confidence) if len(candidate) > 1 else None
    shares = [p.var(ddof=1) / len(p) if len(p) > 1 else None for p in points]
    if shares[0] is None and shares[1] is None:
        return None
    if None in shares:
        spread = next(p for p in points if len(p) > 1)
        error = spread.std(ddof=1) * math.sqrt(1 / len(candidate) + 1 / len(reference))
        df = len(spread) - 1
    else:
        error = math.sqrt(sum(shares))
        df = (sum(shares) ** 2 / sum(share ** 2 / (len(p) - 1) for share, p in zip(shares, points))
              if error > 0 else len(candidate) + len(reference) - 2)
    return t_bounds(candidate.mean() - reference.mean(), error, df, confidence)


def mean_interval(values, confidence=CONFIDENCE):
    """(low, high) of the mean of `values` (two or more) by Student's t, n - 1 degrees of freedom."""
    return t_bounds(values.mean(), values.std(ddof=1) / math.sqrt(len(values)), len(values) - 1, confidence)


def t_bounds(centre, error, df, confidence=CONFIDENCE):
    """`centre` plus and minus Student's t for `df` degrees of freedom times the standard error `error`."""
    half = t_quantile(1 - (1 - confidence) / 2, df) * error
    return centre - half, centre + half


@dataclass(frozen=True)
class Interval:
    """A ratio (candidate over reference) of one figure, with its interval and what it rests on."""
    figure: str
    ratio: float
    low: float
    high: float
    repeats: tuple        # (candidate's, reference's)
    paired: bool          # repeats resampled jointly (the runs were interleaved)
    windows: tuple        # fewest steady windows in a repeat of each run (None for a figure of whole runs)
    method: str

    @property
    def half_width(self):
        return half_width(self.low, self.high)

    def speed(self):
        return speed_of(self)


def speed_of(ratio):
    """(ratio, low, high) of an Interval or a Verdict as speed: above 1 the candidate is faster (a time figure's
    ratio inverted)."""
    if ratio.figure in HIGHER_IS_FASTER:
        return ratio.ratio, ratio.low, ratio.high
    return 1 / ratio.ratio, 1 / ratio.high, 1 / ratio.low


def half_width(low, high):
    """An interval's half width, relative: (high/low)^(1/2) - 1 (0.03: the ratio ±3 %)."""
    return math.sqrt(high / low) - 1


def _log_values(values):
    """The logs of the repeats' values (those that have the figure); None where one is zero: a ratio to it has no
    bound (torch's eager step compiles nothing), and leaving it out would rest the verdict on the other repeats."""
    values = [v for v in values if v is not None]
    if any(v <= 0 for v in values):
        return None
    return np.log(np.array(values, dtype=float))


def _kept_pairs(sides, paired, present):
    """Each side's per-repeat figures; where the repeats are paired (repeat k of one run beside repeat k of the
    other), only the pairs whose two repeats both have it: one left out alone would pair repeats that never ran
    beside each other."""
    if not paired or len(sides[0]) != len(sides[1]):
        return sides
    kept = [k for k, pair in enumerate(zip(*sides)) if all(present(figure) for figure in pair)]
    return [[side[k] for k in kept] for side in sides]


def ratio_interval(key, candidate, reference, paired=False, resamples=RESAMPLES, seed=SEED, confidence=CONFIDENCE):
    """The candidate's `key` over the reference's, with its interval, or None where either lacks it.

    `candidate`, `reference`: the results of each run's repeats. The ratio is that of the two runs' geometric
    means over their repeats of each repeat's figure (for the WINDOW_FIGURES, each repeat's figure of its steady
    windows), its interval `repeats_interval`'s: from the spread between repeats, which holds the noise within each
    run too. `paired`: the repeats were interleaved (repeat k of one beside repeat k of the other) and are as many.
    Where each run is one repeat, a window figure's interval is a bootstrap of the two runs' windows, the noise
    within each run alone (None where each is one window: an interval of zero width); any other figure has none."""
    if key in WINDOW_FIGURES:
        every = _kept_pairs([[steady_windows(r["history"]) for r in results] for results in (candidate, reference)],
                            paired, lambda windows: len(windows) > 0)
        sides = [[w for w in side if len(w)] for side in every]
        if not all(sides):
            return None
        points = [_log_values([window_figure(key, w) for w in side]) for side in sides]
        if any(p is None for p in points):
            return None  # a repeat that measured 0 (no tokens counted): a ratio to it has no bound, as `_log_values`'
        windows = tuple(min(len(w) for w in side) for side in sides)
    else:
        figure = FIGURES_BY_KEY[key]
        values = _kept_pairs([[figure.value(r) for r in results] for results in (candidate, reference)], paired,
                             lambda value: value is not None)
        points = [_log_values(side) for side in values]
        if any(p is None or len(p) == 0 for p in points):
            return None
        sides, windows = None, None
    counts = tuple(len(p) for p in points)
    paired = paired and counts[0] == counts[1] > 1
    point = points[0].mean() - points[1].mean()
    bounds = repeats_interval(points, paired, confidence)
    if bounds is not None:
        method = ("Student's t over the paired repeats' log ratios" if paired else
                  "Welch's t over the repeats' logs" if min(counts) > 1 else
                  "Student's t over the repeats' logs, the other run's spread standing for the single repeat's")
        windows = None  # the windows within each run are in its repeat's figure
    elif sides is not None and not all(len(side[0]) == 1 for side in sides):
        rng = np.random.default_rng(seed)
        statistic = (np.log(_resampled_window_figure(key, sides[0][0], rng, resamples))
                     - np.log(_resampled_window_figure(key, sides[1][0], rng, resamples)))
        tail = (1 - confidence) / 2 * 100
        bounds = np.percentile(statistic, [tail, 100 - tail])
        method = "bootstrap of the log ratio over the steady windows of each run's one repeat"
    else:
        return None  # one repeat of one window (or of a whole-run figure) each: nothing shows the noise
    low, high = bounds
    return Interval(key, float(math.exp(point)), float(math.exp(min(low, point))), float(math.exp(max(high, point))),
                    counts, paired, windows, method)


def same_session(candidate, reference):
    """Whether two runs' repeats were interleaved in one comparison (every result names the same `run_group`,
    which `mtbench compare` sets, and repeat k of each trained in its round k) and are as many: their repeats are
    paired."""
    groups = {(r.get("config") or {}).get("run_group") for r in (*candidate, *reference)}
    return (len(groups) == 1 and None not in groups and len(candidate) == len(reference) > 1
            and rounds_in_order(candidate, reference))


def rounds_in_order(candidate, reference):
    """Whether each pair of repeats (candidate's k, reference's k) was written before the next pair, by the
    results' `created` times, as a comparison trains every run once a round: two comparisons written under one
    name (the group) are no session, the one's rounds all before the other's. True where a result has no time."""
    try:
        rounds = [sorted(datetime.fromisoformat(result["created"]) for result in pair)
                  for pair in zip(candidate, reference)]
    except (KeyError, TypeError, ValueError):
        return True
    return all(earlier[-1] <= later[0] for earlier, later in zip(rounds, rounds[1:]))


# ---- words -------------------------------------------------------------------------------------------------------

def factor_text(value, decimals=2):
    return f"{value:.{decimals}f}"


def range_text(low, high, decimals=None):
    """'0.98–1.04': a ratio's interval in `decimals`, by default in the fewest of 2 to 6 at which no bound but 1
    itself reads 1.00: an interval that holds 1 (0.32 to 1.005) must not read as ending below it ('0.32–1.00')."""
    if decimals is None:
        decimals = next((d for d in (2, 3, 4, 5) if all(bound == 1 or factor_text(bound, d) != factor_text(1, d)
                                                        for bound in (low, high))), 6)
    return f"{factor_text(low, decimals)}–{factor_text(high, decimals)}"


def called_figures(factor, low, high):
    """(factor, interval) of a called difference (`factor` and its interval as speeds, each above 1) in the decimals
    it takes that none of them reads 1.00: ('1.004', '1.002–1.006'), not a '1.00x faster'."""
    decimals = next((d for d in (2, 3, 4) if factor_text(min(factor, low), d) != factor_text(1, d)), 4)
    return factor_text(factor, decimals), range_text(low, high, decimals)


def speeds_of_call(call, speed, low, high):
    """(factor, low, high) of a 'faster' or 'slower' call, each above 1: the speed-up, or the slow-down."""
    return (speed, low, high) if call == "faster" else (1 / speed, 1 / high, 1 / low)


@dataclass(frozen=True)
class Verdict:
    run: str
    against: str
    figure: str
    ratio: float
    low: float
    high: float
    call: str          # 'faster', 'slower', 'no difference' or 'undetermined' (`undetermined_reason`)
    text: str
    noise_floor: float  # the floor it was held to (a fraction), None where none was measured
    repeats: tuple
    paired: bool
    warnings: tuple
    loaded: tuple = ()  # the runs (of `run` and `against`) of which a repeat trained on a loaded machine
    undetermined: str = None  # why no difference can be called (`undetermined_reason`), None where one can

    @property
    def called(self):
        """Whether it calls a difference ('faster' or 'slower')."""
        return self.call in ("faster", "slower")

    def to_dict(self):
        return {**asdict(self), "repeats": list(self.repeats), "warnings": list(self.warnings),
                "loaded": list(self.loaded)}

    def speed(self):
        return speed_of(self)

    def unqualified_text(self):
        """Its text without the load it names: where every run of a comparison was loaded, that is said once."""
        return self.text.removesuffix(loaded_text(self.loaded))

    def cell(self):
        """'1.23x faster (1.19–1.27)' (as speed), 'no difference (0.98–1.04)' (the figure's ratio): a table's cell."""
        speed, low, high = self.speed()
        if self.called:
            factor, interval = called_figures(*speeds_of_call(self.call, speed, low, high))
            text = f"{factor}x {self.call} ({interval})"
        elif self.call == UNDETERMINED:
            # the line below says why
            text = f"undetermined ({range_text(self.low, self.high)}), {UNDETERMINED_CELLS[self.undetermined]}"
        else:
            text = f"no difference ({range_text(self.low, self.high)})"  # the figure's own ratio, as in `verdict`
            if too_wide(self, self.noise_floor):
                text += ", too wide to tell"
        return text + (", loaded machine: not reliable" if self.loaded else "")


FIGURE_WORDS = {"tokens_per_s": "tokens/s", "step_s_median": "steady step time", "step_s_p90": "steady step p90",
                "compile_s": "compile time", "train_s": "train time", "total_s": "total time",
                "translate_s": "test translation time", "mfu": "MFU (padded)",
                "mfu_real_tokens": "MFU (real tokens)"}


UNDETERMINED = "undetermined"
ONE_REPEAT_EACH = (f"one repeat each, whose interval holds the noise within each run, not between runs (--repeats "
                   f"{MIN_REPEATS} or more)")
# An interval that reaches past this on both sides (or past the noise floor, where that is wider) cannot tell no
# difference from a slowdown or a speed-up of that size: its 'no difference' says so.
TOO_WIDE = 0.10


NO_SPREAD = ("the repeats (or their pairs' ratios) measured it alike, so their spread, which the interval is drawn "
             "from, shows none of the noise between runs")
# Below this relative half width an interval holds no spread: Student's t of a spread of 0 (repeats of one figure
# each, equal to the last digit) is an interval of zero width, which called 1.0001x 'faster' as certain.
NO_WIDTH = 1e-12
# An undetermined verdict's reason, as its table cell says it.
UNDETERMINED_CELLS = {ONE_REPEAT_EACH: "1 repeat each", NO_SPREAD: "repeats alike"}


def undetermined_reason(interval):
    """Why no difference can be called from `interval` though it has one, or None: each run is one repeat, whose
    bootstrap holds the noise within each run alone. Of identical configurations whose runs scatter 2 % between
    them and 0.5 % within, such an interval excluded 1 for 93 % of 300 pairs, and lay beyond a floor of that 2 % for
    42 % (a floor is the typical stray, not a bound), by this module's own intervals (2026-12-06). Or an interval
    of zero width about a ratio other than 1 (`NO_SPREAD`): the repeats' spread measured no noise, which the
    machine has; equal figures (a ratio of 1) are no difference, as said."""
    if max(interval.repeats) == 1:
        return ONE_REPEAT_EACH
    if half_width(interval.low, interval.high) < NO_WIDTH and abs(math.log(interval.ratio)) >= NO_WIDTH:
        return NO_SPREAD
    return None


def too_wide(interval, noise_floor=None):
    """Whether an interval that holds 1 also reaches past ±`TOO_WIDE` (or the noise floor, where wider) on both
    sides: its 'no difference' rules out neither a slowdown nor a speed-up of that size (0.01–3.79)."""
    margin = 1 + max(TOO_WIDE, noise_floor or 0.0)
    _, low, high = interval.speed()
    return low < 1 / margin and high > margin


def call_of(interval, noise_floor=None):
    """'faster', 'slower', 'no difference' or 'undetermined' (`undetermined_reason`): a difference is called only
    where the whole interval lies beyond the noise floor (a fraction, as `noise_floor_of` gives it; without one,
    where the interval excludes 1): even its bound nearest to 1 is a larger difference than the machine makes of
    one configuration run twice."""
    if undetermined_reason(interval):
        return UNDETERMINED
    _, low, high = interval.speed()
    bound = 1 + (noise_floor or 0.0)
    if low > bound:
        return "faster"
    if high < 1 / bound:
        return "slower"
    return "no difference"


def repeat_warnings(interval):
    """What an interval rests on that may fail it: one repeat a run (the noise within runs alone), few repeats
    (a spread from a handful of runs), or too few windows within a run to resample."""
    warnings = []
    fewest = min(interval.repeats)
    if fewest < MIN_REPEATS:
        what = ("the intervals count only the noise within each run, not between runs" if max(interval.repeats) == 1
                else "the other run's spread between its repeats stands for this one's" if fewest == 1
                else "the interval rests on the spread of a few runs, taken to scatter normally")
        # --repeats auto ends this short only when its budget ran out
        warnings.append(f"{fewest} repeat{'s' if fewest > 1 else ''}: {what} (--repeats {MIN_REPEATS} or more, or "
                        f"--repeats auto with a --repeats-budget that leaves time for {MIN_REPEATS})")
    if interval.windows and min(interval.windows) < MIN_WINDOWS:
        warnings.append(few_windows_text(min(interval.windows)))
    return warnings


def loaded_runs(runs):
    """The names among `runs` ({name: the results of its repeats}) of which a repeat carries a load warning
    (`LOAD_WARNINGS`), in their order."""
    return tuple(name for name, results in runs.items()
                 if any(text.startswith(LOAD_WARNINGS) for result in results for text in run_warnings(result)))


def loaded_text(loaded):
    """', measured on a loaded machine (A and B): not reliable' of the runs `loaded`; '' of none."""
    return f", measured on a loaded machine ({' and '.join(loaded)}): not reliable" if loaded else ""


def verdict(run, against, interval, noise_floor=None, loaded=()):
    """The interval of `run` against `against` in words, as a Verdict; `loaded`: those of the two that trained on
    a loaded machine (`loaded_runs`), which the words name. The call stays the interval's: it says what was
    measured, and the load, which may have made the difference, is said beside it."""
    call = call_of(interval, noise_floor)
    what = FIGURE_WORDS.get(interval.figure, interval.figure)
    speed, low, high = interval.speed()
    undetermined = undetermined_reason(interval)
    if call in ("faster", "slower"):
        factor, interval_text = called_figures(*speeds_of_call(call, speed, low, high))
        text = f"{run} is {factor}x {call} than {against} in {what} ({interval_text})"
    elif undetermined:
        # The figure's own ratio, as under 'no difference': "0.53x jax's tokens/s", "1.21x jax's steady step time".
        text = (f"{run}: {factor_text(interval.ratio)}x {against}'s {what} "
                f"({range_text(interval.low, interval.high)}), undetermined: {undetermined}")
    else:
        excluded = low > 1 or high < 1  # a difference, but not beyond the noise floor
        inside = f", within the noise floor of ±{noise_floor:.1%}" if excluded and noise_floor else ""
        # Without "faster" or "slower" to say which way it reads, the interval is the figure's own ratio, as
        # `low` and `high` are (a time's, not its inverse).
        text = (f"{run}: no difference from {against} in {what} beyond the noise "
                f"({range_text(interval.low, interval.high)}{inside})")
        if too_wide(interval, noise_floor):
            margin = max(TOO_WIDE, noise_floor or 0.0)
            text += (f", an interval too wide to tell it from a ±{margin:.0%} difference (more repeats, on a quieter "
                     f"machine)")
    text += loaded_text(loaded)
    return Verdict(run, against, interval.figure, interval.ratio, interval.low, interval.high, call, text,
                   noise_floor, interval.repeats, interval.paired, tuple(repeat_warnings(interval)), tuple(loaded),
                   undetermined)


def held_verdict(key, run, run_results, against, against_results, paired=False, noise_floor=None):
    """Figure `key` of the run named `run` (the results of its repeats) against `against`'s, as a Verdict: its
    `ratio_interval` (`paired` where their repeats were interleaved) held to `noise_floor`, naming a run that
    trained on a loaded machine; None where no interval can be drawn. A comparison's verdicts against its baseline
    and between counterparts, and a regression gate's, are all this one."""
    interval = ratio_interval(key, run_results, against_results, paired)
    return interval and verdict(run, against, interval, noise_floor,
                                loaded_runs({run: run_results, against: against_results}))


def noise_floor_line(record):
    """'noise floor: tokens/s ±2.1 %, steady step time ±0.9 % (A/A: ...)' of a recorded noise floor."""
    if not record:
        return "noise floor: not measured (compare --aa measures one): differences are held to their intervals alone"
    floors = ", ".join(f"{FIGURE_WORDS.get(key, key)} ±{entry['floor']:.1%}" for key, entry in record["figures"].items())
    losses = record.get("twin_losses")  # compare JSONs before 2026-12-02 did not record it
    said = "" if losses is None else (f"; its losses {percent(losses['max_relative_difference'])} from the "
                                      f"baseline's at most, first {losses['steps']} steps")
    # Twins of one configuration whose interval leaves out 1 differed by more than their own noise: the machine
    # changed between them (another load, a clock), and the floor they set hides every difference below theirs.
    # Not of one repeat each, whose interval holds no noise between runs (`undetermined_reason`): two processes
    # differ beyond it as a rule. (A floor written by hand may hold its floor alone.)
    apart = [f"{FIGURE_WORDS.get(key, key)} {range_text(entry['low'], entry['high'])}"
             for key, entry in record["figures"].items()
             if "low" in entry and entry.get("repeats", 2) > 1 and not entry["low"] <= 1 <= entry["high"]]
    warned = (f"; its twins differed beyond their own interval ({', '.join(apart)}): the machine changed between "
              f"them, so this floor hides real differences below it") if apart else ""
    return f"noise floor: {floors} ({record['measured_by']}{said}){warned}"


def noise_floor_of(key, twins, baseline):
    """The noise floor an A/A (the same configuration twice, repeat k of `twins` beside repeat k of `baseline`)
    shows: how far from 1 its repeats' ratios of `key` (each run's figure of its steady windows) stray, as the root
    mean square of their logs, a fraction (0.021: two runs of one configuration differ by ±2.1 % on this machine).
    The repeats' own ratios, not an interval of their mean: with few repeats Student's t would make that bound a
    factor, and a verdict's interval already holds the noise of its mean. Their typical stray, not the farthest:
    the farthest of n grows with n, so that more repeats would call fewer real differences. None where a run has
    no steady window."""
    strays = []
    for twin, base in zip(twins, baseline):
        sides = [steady_windows(result["history"]) for result in (twin, base)]
        if not all(len(side) for side in sides):
            return None
        strays.append(abs(math.log(window_figure(key, sides[0]) / window_figure(key, sides[1]))))
    return math.exp(math.sqrt(np.mean(np.square(strays)))) - 1 if strays else None


def parse_percent(text, option):
    """'5%', '5 %' or '5' -> 0.05; a one-line MtbenchError names `option` otherwise. A number below 1 without its
    % sign is refused: '0.05' reads as the fraction a JSON output records (`fail_if_slower`), which is 5 %, and as
    0.05 % alike."""
    from mtbench.errors import MtbenchError
    match = re.fullmatch(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*(%?)\s*", str(text))
    if not match or not 0 < float(match.group(1)) < 100:
        raise MtbenchError(f"{option}: '{text}' is not a percentage between 0 and 100 (such as 5%)")
    value = float(match.group(1))
    if value < 1 and not match.group(2):
        raise MtbenchError(f"{option}: '{text}' is {value:g} % or, as a fraction, {value * 100:g} %; give it with "
                           f"its % sign ('{value:g}%' or '{value * 100:g}%')")
    return value / 100


def significantly_slower(interval, threshold):
    """Whether the candidate is slower than the reference by more than `threshold` (a fraction) with the whole
    interval past it: its speed (tokens/s) is below 1 - threshold of the reference's even at the interval's faster
    bound, as `--fail-if-slower` says (a time ratio above 1 + threshold failed a 4.9 % drop at 5 %)."""
    _, _, high = interval.speed()
    return high < 1 - threshold


# ---- compilation -------------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class BreakEven:
    run: str
    against: str
    text: str
    steps: int = None          # steps after which the faster-stepping run has caught up (None: never, or in tokens)
    seconds: float = None      # the training time (compilation included) at that point
    faster_compiling: str = None
    faster_stepping: str = None  # where the runs' steps differ in work, the faster in tokens/s
    compile_caches: dict = None  # {run: the state of its compile cache} the compile times rest on
    tokens: int = None         # tokens after which it has caught up, where the runs' steps differ in work (else None)
    unit: str = "step"         # what it counts: "token" where the runs' steps differ in work

    @property
    def names_a_point(self):
        """Whether it names where one run overtakes the other (not `never` or `undetermined`)."""
        return self.steps is not None or self.tokens is not None

    def to_dict(self):
        return asdict(self)


# How the pace of a break-even's unit is said: (both runs alike, a run faster).
PACE_WORDS = {"step": ("step alike", "steps faster"), "token": ("train tokens alike", "trains faster in tokens/s")}


def break_even(run, against, compile_s, step_s, unit="step"):
    """After how many steps the faster-stepping of two runs overtakes the faster-compiling one, where the total
    time of n steps is compile_s + n x step_s (each run's own figures, `compile_s` and `step_s` as
    {name: value}). With `unit` "token", `step_s` holds each run's seconds a token (1 / tokens/s) and the count is
    of tokens: runs whose steps differ in work (another batch or block) share no step, only a token. None where
    either lacks a figure."""
    if any(compile_s.get(name) is None or step_s.get(name) is None for name in (run, against)):
        return None
    alike, faster = PACE_WORDS[unit]
    (c_run, c_against), (s_run, s_against) = (compile_s[run], compile_s[against]), (step_s[run], step_s[against])
    if c_run == c_against or s_run == s_against:
        same = "compile alike" if c_run == c_against else alike
        return BreakEven(run, against, f"never: both {same}, so the other figure decides from the start",
                         unit=unit)
    fast_compile, slow_compile = (run, against) if c_run < c_against else (against, run)
    if (s_run < s_against) == (c_run < c_against):
        return BreakEven(run, against, f"never: {fast_compile} compiles faster and {faster}",
                         faster_compiling=fast_compile, faster_stepping=fast_compile, unit=unit)
    count = (compile_s[slow_compile] - compile_s[fast_compile]) / (step_s[fast_compile] - step_s[slow_compile])
    seconds = compile_s[fast_compile] + count * step_s[fast_compile]
    whole = math.ceil(round(count, 6))  # 2 / 0.01 is 200.00000000000003 in floats: 200 steps, not 201
    text = f"{slow_compile} overtakes {fast_compile} after {whole:,} {unit}{'' if whole == 1 else 's'} ({seconds:,.1f} s)"
    counted = {"tokens": whole} if unit == "token" else {"steps": whole}
    return BreakEven(run, against, text, seconds=seconds, faster_compiling=fast_compile,
                     faster_stepping=slow_compile, unit=unit, **counted)


def mean_step_s(result):
    """A run's mean steady step (its steady seconds over its steady steps), what its total time grows by a step;
    the median step for a result that recorded neither (before 2026-11-23)."""
    timing = result["timing"]
    if timing.get("steady_steps") and timing.get("steady_s") is not None:
        return timing["steady_s"] / timing["steady_steps"]
    return timing.get("step_s_median")


def compile_excess(history, up_to_step=None):
    """The compilation of a run's first-of-shape steps up to `up_to_step` (all without it), as `timing.compile_s`
    counts it (`timing.compile_seconds`: each one's time less its shape's median steady step, estimated for a shape
    with none); without a steady step, their whole time."""
    # A history written before its entries held their shape counts every step as of one shape, as it was counted.
    warm_ups = [(entry.get("shape") or (), entry["seconds"]) for entry in history
                if entry.get("first_of_shape") and not set_aside(entry)
                and (up_to_step is None or entry["step"] <= up_to_step)]
    steady = [(entry.get("shape") or (), entry["seconds"]) for entry in history if is_steady(entry)]
    compile_s, _ = compile_seconds(warm_ups, steady)
    return sum(seconds for _, seconds in warm_ups) if compile_s is None else compile_s


def target_times(result):
    """(time to the target with compilation, without it) in seconds, or None where the run reached no target."""
    target = result.get("target") or {}
    seconds, step = target.get("time_to_target_s"), target.get("steps_to_target")
    if seconds is None or step is None:
        return None
    return seconds, max(seconds - compile_excess(result["history"], step), 0.0)


def noise_floor_record(label, baseline, twins, parity_steps=PARITY_STEPS):
    """The noise floor an A/A measured (the `baseline` run's results and its `twins`', repeat by repeat): for each
    window figure its ratio, interval and floor (`noise_floor_of`), and how far the twins' losses strayed from
    their baseline repeats' (`twin_losses`: the same arithmetic twice, so any difference is the backend's own
    nondeterminism, not the timing's noise); None without twins."""
    count = min(len(baseline), len(twins))
    figures = {}
    for key in WINDOW_FIGURES:
        interval = ratio_interval(key, twins[:count], baseline[:count], paired=True) if count else None
        floor = noise_floor_of(key, twins[:count], baseline[:count])
        if interval is not None and floor is not None:
            figures[key] = {"floor": floor, "ratio": interval.ratio, "low": interval.low, "high": interval.high,
                            "repeats": count}
    if not figures:
        return None
    return {"measured_by": f"A/A: run '{label}' twice in each of {count} repeat(s), interleaved",
            "figures": figures, "twin_losses": twin_losses(baseline[:count], twins[:count], parity_steps)}


def twin_losses(baseline, twins, steps):
    """{max_relative_difference, at_step, repeat, steps} of the twins' loss curves against their baseline repeats'
    (the parity check's measure, windows of 16-bit runs included; the largest over the repeats), or None where
    no pair has a loss to compare."""
    worst = None
    for repeat, (base, twin) in enumerate(zip(baseline, twins), start=1):
        for pair in check_parity([("baseline", base), ("twin", twin)], lambda result: "one configuration",
                                 steps=steps).pairs:
            if worst is None or not pair.max_relative_difference <= worst["max_relative_difference"]:
                worst = {"max_relative_difference": pair.max_relative_difference, "at_step": pair.at_step,
                         "repeat": repeat, "steps": pair.steps}
    return worst
