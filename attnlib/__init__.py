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
    orthogonal_offset,
    selection_mass,
)
from .model import (
    JointAttention,
    ProblemStack,
    TokenSelectionProblem,
    prompt_attention,
    self_attention,
    stack_problems,
    token_selection,
)
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
    "orthogonal_offset",
    "selection_mass",
    "JointAttention",
    "TokenSelectionProblem",
    "ProblemStack",
    "stack_problems",
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

# Chapter modules add their public names in their own block below (one block per module).
# --- paths (chapter 2) ---
from .paths import (  # noqa: E402
    NonlinearHeadAttention,
    RegularizationPath,
    factor_grad,
    log_gap_grad,
    nonlinear_head,
    regularization_path,
)

__all__ += [
    "NonlinearHeadAttention",
    "RegularizationPath",
    "factor_grad",
    "log_gap_grad",
    "nonlinear_head",
    "regularization_path",
]
# --- end paths ---
# --- basins (chapter 3) ---
from .basins import BasinMap, basin_map, classify_motion  # noqa: E402

__all__ += ["BasinMap", "basin_map", "classify_motion"]
# --- end basins ---
# --- joint (chapter 4) ---
from .joint import (  # noqa: E402
    ALIGNMENT_CLASSES,
    JointSVMs,
    angle_degrees,
    balanced_direction,
    classify_alignment,
    joint_svms,
    random_joint_tokens,
)

__all__ += [
    "ALIGNMENT_CLASSES",
    "JointSVMs",
    "angle_degrees",
    "balanced_direction",
    "classify_alignment",
    "joint_svms",
    "random_joint_tokens",
]
# --- end joint ---
# --- rates (chapter 5) ---
from . import rates  # noqa: E402
from .rates import (  # noqa: E402
    CROSS_ENTROPY,
    Reduced,
    curves,
    log_steps,
    logistic_regression,
    reduce_to_span,
    separable_data,
    train_many,
)

__all__ += [
    "rates",
    "CROSS_ENTROPY",
    "Reduced",
    "curves",
    "log_steps",
    "logistic_regression",
    "reduce_to_span",
    "separable_data",
    "train_many",
]
# --- end rates ---

# --- digits (chapter 6) ---
from .digits import DigitPatches, digit_patches, fit_patch_head  # noqa: E402

__all__ += ["DigitPatches", "digit_patches", "fit_patch_head"]
# --- end digits ---
