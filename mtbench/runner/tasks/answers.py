"""A task's own code as the run calls it (`Task.prepare`, `Task.batches`, `Evaluator.validate` and `evaluate`),
each answer checked for what the run reads of it: a plugin's mistake is named with its task and plugin, in one line,
where it would have surfaced later as an AttributeError or KeyError naming nothing."""

from mtbench.plugins.api import Batch, TaskData


def task_evaluation(plugins, evaluator, phase):
    """`Evaluator.evaluate(phase)`, run as the task's code and checked to be (metrics, sidecar), two dicts, the
    metrics holding every key of `Task.metrics` (one left out would read as a partial result's null in a completed
    run): a mistake names the task and its plugin."""
    with plugins.task_code():
        evaluation = evaluator.evaluate(phase)
        if not (isinstance(evaluation, (tuple, list)) and len(evaluation) == 2
                and all(isinstance(part, dict) for part in evaluation)):
            raise TypeError(f"Evaluator.evaluate returned {kind_of(evaluation)}, not (metrics, sidecar), two dicts")
        missing = [key for key in plugins.task.metrics if key not in evaluation[0]]
        if missing:
            raise ValueError(f"Evaluator.evaluate's metrics leave out {', '.join(missing)}, "
                             f"{'keys' if len(missing) > 1 else 'a key'} of the task's metrics")
    return evaluation


def task_validation(plugins, evaluator):
    """`Evaluator.validate`, run as the task's code and checked to hold the task's `validation_metric`: a mistake
    names the task and its plugin, and ends the run as failed with its partial result."""
    metric = plugins.task.validation_metric

    def validate():
        with plugins.task_code():
            scores = evaluator.validate()
            if not isinstance(scores, dict) or metric not in scores:
                raise ValueError(f"Evaluator.validate returned {kind_of(scores)}, not a dict holding the task's "
                                 f"validation_metric '{metric}'")
        return scores
    return validate


def kind_of(value):
    """What a plugin returned, in a few words on one line (its values left out: an array's repr spans lines)."""
    if isinstance(value, dict):
        return f"a dict of {sorted(map(str, value))}"[:120]
    if isinstance(value, (tuple, list)):
        return f"a {type(value).__name__} of ({', '.join(type(part).__name__ for part in value)})"[:120]
    return f"a {type(value).__name__}"


def checked_task_data(data):
    """`Task.prepare`'s answer, a `TaskData` whose record (the result's data section) is a dict."""
    if not isinstance(data, TaskData):
        raise TypeError(f"Task.prepare returned a {type(data).__name__}, not a mtbench.TaskData")
    if not isinstance(data.record, dict):  # the result's data section, which report reads as an object
        raise TypeError(f"Task.prepare's TaskData.record is a {type(data.record).__name__}, not a dict")
    return data


def checked_batch(first):
    """The `Batch` of `Task.batches`' first (epoch, Batch)."""
    if not (isinstance(first, (tuple, list)) and len(first) == 2 and isinstance(first[1], Batch)):
        raise TypeError(f"Task.batches yielded {kind_of(first)}, not (epoch, mtbench.Batch)")
    return first[1]
