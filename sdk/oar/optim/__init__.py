"""Optimizers and learning-rate schedules (``import oar.optim``)."""

from oar.optim import lr_scheduler
from oar.optim.adamw import Adam, AdamW, adam_update
from oar.optim.lbfgs import LBFGS
from oar.optim.optimizer import Optimizer, OptimizerStateError
from oar.optim.sgd import SGD

__all__ = ["Adam", "AdamW", "adam_update", "LBFGS", "Optimizer", "OptimizerStateError", "SGD", "lr_scheduler"]
