"""attnlib: gradient descent on softmax attention selects tokens, and converges in direction to
a max-margin SVM.

Companion library of the attnlib book on [MMTS] (Tarzanagh et al., NeurIPS 2023) and [FAST]
(Vasudeva, Deora, Thrampoulidis). One abstraction: logits linear in the parameter with fixed
token scores (:class:`TokenSelectionProblem`); the prompt-attention and self-attention models
are two constructors of it, and the SVMs, optimizers and metrics serve both.

The house, one room per kind (lower floors never import higher ones):

- the core, one module per kind of object: ``losses``, ``model`` (every problem), ``svm`` (every
  max-margin program), ``optim`` (every trainer), ``paths`` (regularization paths), ``metrics``,
  ``fits`` (curve fits), ``flow`` (gradient flow, the smoothness bound, GD's asymptotic regime),
  ``datasets`` (every instance generator);
- ``experiments.<chapter>``: a chapter's drivers, tolerances, not-applicable rules and tables;
- ``figures.<chapter>`` and ``figures.common``: what the chapters draw;
- ``book``: the book's machinery (checks, parameters, explorers, run, sweep, build).

This namespace holds the core contract below (at most 40 names) and the subpackages.

>>> import attnlib as al
>>> prob = al.datasets.single_input()
>>> sol = al.max_margin(prob)
>>> traj = al.train(prob, al.datasets.SINGLE_INPUT_INITS, steps=1000)
>>> bool(al.cosine(traj.final, sol.theta).min() > 0.99)
True
"""

import importlib

# The rooms. ``paths``, ``flow``, ``basins``, ``experiments`` and ``figures`` load on first use (the
# module ``__getattr__`` below, PEP 562): ``import attnlib`` then costs numpy and the core, no scipy
# (scipy.optimize alone takes several times numpy's import), not scipy.integrate, matplotlib.pyplot
# and every chapter's drivers, which a page, a sweep point or a script pays for only if it reaches
# them. ``al.figures``, ``al.regularization_path`` etc. and ``from attnlib import flow`` work as before.
from . import losses as losses
from . import model as model
from . import svm as svm
from . import optim as optim
from . import metrics as metrics
from . import fits as fits
from . import datasets as datasets
from . import book as book

# The problem: logits linear in the parameter, fixed token scores, a decreasing loss.
from .losses import get_loss
from .model import AttentionProblem, JointAttention, ProblemStack, TokenSelectionProblem
from .model import prompt_attention, self_attention, stack_problems, token_selection

# The max-margin programs.
from .svm import InfeasibleError, MaxMarginSolution, enumerate_selections, joint_svms, label_svm, max_margin

# Training: GD, normalised GD and Polyak over batches of initialisations and of problems.
from .optim import JointTrajectory, Trajectory, log_steps, step_rule, train, train_joint, train_many

# Measuring a trajectory against the theory.
from .metrics import angle_degrees, cosine, direction_error, log_one_minus_mass, normalized_margin
from .metrics import one_minus_cosine, orthogonal_offset
from .fits import fit_slope

# The book's machinery a chapter calls: its checks, its parameter validation, its explorers.
from .book import Checks, integer, list_of, one_of, real, text, validate

__version__ = "0.1.0"

_LAZY_ROOMS = ("paths", "flow", "basins", "experiments", "figures")
#: Names of the front door that live in a lazy room: name → room.
_LAZY_NAMES = {"RegularizationPath": "paths", "regularization_path": "paths"}


def __getattr__(name: str):
    """Load a lazy room (``paths``, ``flow``, ``basins``, ``experiments``, ``figures``), a name of one, or
    ``explorer`` on first access."""
    if name in _LAZY_ROOMS:
        return importlib.import_module(f".{name}", __name__)  # the import binds it in this namespace
    if name in _LAZY_NAMES:
        value = getattr(importlib.import_module(f".{_LAZY_NAMES[name]}", __name__), name)
        globals()[name] = value  # once: later lookups find it without __getattr__
        return value
    if name == "explorer":  # from attnlib.book.widgets, which imports matplotlib: also on first use
        return book.explorer
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY_ROOMS) | set(_LAZY_NAMES) | {"explorer"})


__all__ = [
    "get_loss",
    "AttentionProblem",
    "JointAttention",
    "ProblemStack",
    "TokenSelectionProblem",
    "prompt_attention",
    "self_attention",
    "stack_problems",
    "token_selection",
    "InfeasibleError",
    "MaxMarginSolution",
    "enumerate_selections",
    "joint_svms",
    "label_svm",
    "max_margin",
    "JointTrajectory",
    "Trajectory",
    "log_steps",
    "step_rule",
    "train",
    "train_joint",
    "train_many",
    "RegularizationPath",
    "regularization_path",
    "angle_degrees",
    "cosine",
    "direction_error",
    "log_one_minus_mass",
    "normalized_margin",
    "one_minus_cosine",
    "orthogonal_offset",
    "fit_slope",
    "Checks",
    "explorer",
    "integer",
    "list_of",
    "one_of",
    "real",
    "text",
    "validate",
]
