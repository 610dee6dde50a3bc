"""The hooks mtbench calls: one task and one model family."""

from mtbench import hookimpl

from mtbench_classification.mlp import MLPClassifierFamily
from mtbench_classification.task import ClassificationTask


@hookimpl
def mtbench_register_tasks(register):
    register(ClassificationTask())


@hookimpl
def mtbench_register_models(register):
    register(MLPClassifierFamily())
