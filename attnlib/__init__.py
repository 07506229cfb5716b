"""attnlib: gradient descent on softmax attention selects tokens, and converges in direction to
a max-margin SVM.

Companion library of the attnlib book on [MMTS] (Tarzanagh et al., NeurIPS 2023) and [FAST]
(Vasudeva, Deora, Thrampoulidis). One abstraction: logits linear in the parameter with fixed
token scores (:class:`TokenSelectionProblem`); the prompt-attention and self-attention models
are two constructors of it, and the SVMs, optimizers and metrics serve both.

>>> import attnlib as al
>>> prob = al.datasets.single_input()
>>> sol = al.max_margin(prob)
>>> traj = al.train(prob, al.datasets.SINGLE_INPUT_INITS, steps=1000)
>>> bool(al.cosine(traj.final, sol.theta).min() > 0.99)
True
"""

from . import datasets, plots, widgets
from .checks import CHECK_MIME, Check, Checks, check_parameter
from .losses import LOSSES, Loss, get_loss
from .metrics import (
    cosine,
    direction_error,
    fit_slope,
    log_one_minus_mass,
    normalized_margin,
    one_minus_cosine,
    selection_mass,
)
from .model import JointAttention, TokenSelectionProblem, prompt_attention, self_attention, token_selection
from .optim import METHODS, JointTrajectory, Stop, Trajectory, train, train_joint
from .svm import (
    ACTIVE_TOL,
    InfeasibleError,
    LabelSVM,
    MaxMarginSolution,
    SelectionReport,
    enumerate_selections,
    is_locally_optimal,
    label_svm,
    locally_optimal_selections,
    max_margin,
)

__version__ = "0.1.0"

# Chapter modules add their public names in their own block below (one block per module).
# --- paths (chapter 2) ---
# --- end paths ---
# --- basins (chapter 3) ---
# --- end basins ---
# --- joint (chapter 4) ---
# --- end joint ---
# --- rates (chapter 5) ---
# --- end rates ---

__all__ = [
    "datasets",
    "plots",
    "widgets",
    "CHECK_MIME",
    "Check",
    "Checks",
    "check_parameter",
    "LOSSES",
    "Loss",
    "get_loss",
    "cosine",
    "direction_error",
    "fit_slope",
    "log_one_minus_mass",
    "normalized_margin",
    "one_minus_cosine",
    "selection_mass",
    "JointAttention",
    "TokenSelectionProblem",
    "prompt_attention",
    "self_attention",
    "token_selection",
    "METHODS",
    "JointTrajectory",
    "Stop",
    "Trajectory",
    "train",
    "train_joint",
    "ACTIVE_TOL",
    "InfeasibleError",
    "LabelSVM",
    "MaxMarginSolution",
    "SelectionReport",
    "enumerate_selections",
    "is_locally_optimal",
    "label_svm",
    "locally_optimal_selections",
    "max_margin",
]
