"""Live progress on the terminal (rich): preparing the corpus, training and the evaluation after it."""

import contextlib

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from mtbench.figures import is_number
from mtbench.runner.evaluation.sampling import printable


@contextlib.contextmanager
def corpus_progress(console):
    """Yields `progress(done, total)`; the bar appears only on a terminal, when a dataset reports work to do (on a
    file or pipe a transient bar shows nothing but leaves an empty line, before a failure's one line)."""
    bar, task = None, None

    def progress(done, total):
        nonlocal bar, task
        if not console.is_terminal:
            return
        if bar is None:
            bar = Progress(TextColumn("preparing corpus"), BarColumn(), MofNCompleteColumn(), console=console,
                           transient=True)
            bar.start()
            task = bar.add_task("corpus", total=total)
        bar.update(task, completed=done, total=total)

    try:
        yield progress
    finally:
        if bar is not None:
            bar.stop()


class _TrainingBar:
    def __init__(self, bar, task):
        self.bar, self.task = bar, task

    def advance(self, loss, tokens_per_s, step=None, step_s=None):
        self.bar.update(self.task, advance=1, loss=loss, tokens_per_s=tokens_per_s)

    def validation(self, step, scores):
        self.note(validation_line(step, scores))

    def note(self, text):
        self.bar.console.print(text, highlight=False, soft_wrap=True)


class _Silent:
    def advance(self, loss, tokens_per_s, step=None, step_s=None):
        pass

    def validation(self, step, scores):
        pass

    def note(self, text):
        pass


class _LogLines:
    """Off a terminal (a file or a pipe: nohup, SLURM, CI), where a bar shows nothing: one line every `every` steps
    (and the last), as nanoGPT logs, each flushed as it is written."""

    def __init__(self, console, total_steps, every, learning_rate):
        self.console, self.total_steps, self.every, self.learning_rate = console, total_steps, every, learning_rate

    def advance(self, loss, tokens_per_s, step=None, step_s=None):
        if step is None or (step % self.every and step != self.total_steps):
            return
        rate = f"  lr {self.learning_rate(step):.3e}" if self.learning_rate else ""
        self.console.print(f"step {step}/{self.total_steps}  loss {loss:.4f}{rate}  {step_s * 1e3:.1f} ms  "
                           f"{tokens_per_s:,.0f} tok/s", highlight=False, soft_wrap=True)
        self.console.file.flush()

    def validation(self, step, scores):
        self.note(validation_line(step, scores))

    def note(self, text):
        """A line of its own among the step lines (what a signal does to the run)."""
        self.console.print(text, highlight=False, soft_wrap=True)
        self.console.file.flush()


def validation_line(step, scores):
    """'validation at step 500: loss 1.2345, perplexity 3.437, ...': the task's validation figures (a loss to 4
    decimals, as the step lines give it: 4 significant digits read 2.9 for 2.9004), then its texts (a language
    model's --sample-prompt continuation) each on lines of its own, their control characters escaped (`printable`)."""
    figures = ", ".join(f"{name.replace('_', ' ')} {value:{'.4f' if 'loss' in name else '.4g'}}"
                        for name, value in scores.items() if is_number(value))
    texts = "".join(f"\n{name}: {printable(value)}" for name, value in scores.items() if isinstance(value, str))
    return f"validation at step {step}: {figures}{texts}"


@contextlib.contextmanager
def training_progress(console, total_steps, completed=0, log_every=10, learning_rate=None):
    """The bar on a terminal; elsewhere a line every `log_every` steps (`learning_rate(step)`, when given, is the
    rate the optimizer used at that step). Both take `validation(step, scores)` lines."""
    if console.quiet:  # the processes of a run but the first
        yield _Silent()
        return
    if not console.is_terminal:
        yield _LogLines(console, total_steps, log_every, learning_rate)
        return
    columns = (TextColumn("train"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]:.3f}"), TextColumn("{task.fields[tokens_per_s]:,.0f} tok/s"),
               TimeRemainingColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("train", total=total_steps, completed=completed, loss=float("nan"), tokens_per_s=0.0)
        yield _TrainingBar(bar, task)


def announced_phases(stopwatch, console):
    """`stopwatch.phase`, telling as each phase of the evaluation after training starts what runs now: a spinner on
    a terminal, one line elsewhere (a log file). A large model's evaluation on a CPU takes minutes after the last
    step's line."""
    @contextlib.contextmanager
    def phase(name):
        shown = console.status(f"after training: {name} …") if console.is_terminal else contextlib.nullcontext()
        with stopwatch.phase(name), shown:
            if not console.is_terminal:
                console.print(f"after training: {name} …", highlight=False)
                console.file.flush()
            yield
    return phase
