"""Live progress on the terminal (rich): preparing the corpus and training."""

import contextlib

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn


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

    def advance(self, loss, tokens_per_s):
        self.bar.update(self.task, advance=1, loss=loss, tokens_per_s=tokens_per_s)


@contextlib.contextmanager
def training_progress(console, total_steps, completed=0):
    columns = (TextColumn("train"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]:.3f}"), TextColumn("{task.fields[tokens_per_s]:,.0f} tok/s"),
               TimeRemainingColumn())
    with Progress(*columns, console=console) as bar:
        task = bar.add_task("train", total=total_steps, completed=completed, loss=float("nan"), tokens_per_s=0.0)
        yield _TrainingBar(bar, task)
