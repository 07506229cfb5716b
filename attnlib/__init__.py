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

# The problem: logits linear in the parameter, fixed token scores, a decreasing loss.
from .losses import LOSSES, Loss, get_loss
from .model import (
    AttentionProblem,
    JointAttention,
    JointProblem,
    ProblemStack,
    Terms,
    check_labels,
    TokenSelectionProblem,
    prompt_attention,
    self_attention,
    stack_problems,
    token_selection,
)
from .rates import CROSS_ENTROPY, Reduced, logistic_regression, reduce_to_span

# The max-margin programs: ATT-SVM (p, W; Frobenius or nuclear), the label SVM, local optimality.
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

# Training: GD, normalised GD and Polyak over batches of initialisations and of problems.
from .optim import METHODS, JointTrajectory, Stop, Trajectory, train, train_joint
from .optim import GradientDescent, NormalizedGradientDescent, PolyakStep, StepRule, step_rule

# Self-attention with a trainable decoder ([FAST] v2): joint (W, u) training.
from .decoder import DecoderAttention, PlantedTokens, decoder_svms, joint_self_attention, planted_tokens
from .decoder import StackedDecoderAttention, train_decoder_stack
from .optim import train_joint_problem
from .rates import train_many

# Gradient flow to t = 1e15, the smoothness bound L, and plain GD below 1/L (the theorems' regime).
from . import flow
from .flow import FlowTrajectory, gradient_flow, smoothness_bound, train_below_smoothness

# Measuring a trajectory against the theory.
from .metrics import (
    cosine,
    direction_error,
    fit_slope,
    log_one_minus_mass,
    normalized_margin,
    offset_equilibrium,
    offset_exponent,
    one_minus_cosine,
    orthogonal_offset,
    selection_mass,
)
from .metrics import descent_bound, exponential_rate, gradient_cosine
from .metrics import gd_gap_constant, late_offset_exponent, late_offset_ratio, ngd_rate_tolerance
from .metrics import descent_ratio, norm_log_slope, offset_check_horizon, offset_relaxation_reason
from .joint import angle_degrees
from .rates import curves, log_steps
from .rates import half_decade_slopes, inverse_log_vs_power
from .rates import Comparison, SelectionSweep, compare_methods, late_decay, late_slopes, selection_sweep

# Data: the papers' instances by name and the seeded random families.
from . import datasets
from .digits import DigitPatches, digit_patches, fit_patch_head, follow_selection
from .digits import SelectionStudy, attention_run, gap_cone_start, nested_svms, score_spread, selection_study
from .digits import train_problems
from .joint import random_joint_tokens
from .rates import separable_data

# Experiment objects: regularization paths, basin maps, joint SVM pairs.
from .paths import (
    NonlinearHeadAttention,
    RegularizationPath,
    factor_grad,
    log_gap_grad,
    nonlinear_head,
    regularization_path,
    direction_bound,
    margin_ratio,
    min_margin,
    parameter_norm,
    ray_gap_excess,
    ray_margin_bound,
)
from .paths import PathAgainstSVM, paths_against_svm, radius_table, regularization_paths, uncertified
from .paths import MatrixPaths, matrix_paths
from .paths import (
    LocalPathCase,
    admissible_cone_angle,
    cone_margin_bound,
    cone_min_norm,
    cone_project,
    local_path_case,
    local_regularization_path,
    selection_log_gap,
)
from .basins import BasinMap, basin_map, classify_motion, cone_starts, selection_table
from .basins import ConeRuns, ScoreBasinExplorer, SelectionAlignment, basin_table, cone_runs, key_plane_grid
from .basins import ngd_and_gd_basin_maps, selection_alignment
from .joint import ALIGNMENT_CLASSES, JointSVMs, balanced_direction, classify_alignment, joint_svms
from .joint import RandomJointRuns, offset_tolerance, random_joint_runs
from .joint import JointPath, joint_path_bounds, joint_regularization_path, train_joint_stack

# Self-attention as the papers train it: W = K Qᵀ, the nuclear-norm SVM, the rank-versus-d grid.
from .factorization import (
    OFFICIAL_RANK_GRID,
    FactorTrajectory,
    NuclearSVM,
    RankGrid,
    kq_init,
    nuclear_svm,
    numerical_rank,
    rank_instance,
    svm_constraints,
    svm_rank_grid,
    train_kq,
    SVMBatch,
    frobenius_svm_batch,
    nuclear_svm_batch,
    train_kq_grid,
    svm_pair_batch,
    LocalConvergence,
    local_convergence,
)

# Figures, and the book's machinery (checks, parameters, explorers, run, sweep, build).
from . import book, plots, rates
from .book import (
    CHECK_MIME,
    STATUSES,
    Check,
    Checks,
    boolean,
    check_parameter,
    integer,
    list_of,
    one_of,
    real,
    text,
    validate,
    widgets,
    explorer,
)

__version__ = "0.1.0"

__all__ = [
    "datasets",
    "flow",
    "FlowTrajectory",
    "gradient_flow",
    "smoothness_bound",
    "train_below_smoothness",
    "plots",
    "rates",
    "book",
    "widgets",
    "Checks",
    "validate",
    "explorer",
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
    "offset_exponent",
    "offset_equilibrium",
    "descent_bound",
    "exponential_rate",
    "gradient_cosine",
    "gd_gap_constant",
    "late_offset_exponent",
    "late_offset_ratio",
    "ngd_rate_tolerance",
    "descent_ratio",
    "offset_relaxation_reason",
    "offset_check_horizon",
    "norm_log_slope",
    "JointAttention",
    "ProblemStack",
    "TokenSelectionProblem",
    "prompt_attention",
    "self_attention",
    "stack_problems",
    "token_selection",
    "AttentionProblem",
    "JointProblem",
    "Terms",
    "check_labels",
    "StepRule",
    "GradientDescent",
    "NormalizedGradientDescent",
    "PolyakStep",
    "step_rule",
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
    "NonlinearHeadAttention",
    "RegularizationPath",
    "factor_grad",
    "log_gap_grad",
    "nonlinear_head",
    "regularization_path",
    "direction_bound",
    "margin_ratio",
    "min_margin",
    "parameter_norm",
    "ray_gap_excess",
    "ray_margin_bound",
    "PathAgainstSVM",
    "paths_against_svm",
    "radius_table",
    "regularization_paths",
    "uncertified",
    "MatrixPaths",
    "matrix_paths",
    "BasinMap",
    "basin_map",
    "classify_motion",
    "cone_starts",
    "selection_table",
    "key_plane_grid",
    "ngd_and_gd_basin_maps",
    "basin_table",
    "ConeRuns",
    "cone_runs",
    "SelectionAlignment",
    "selection_alignment",
    "ScoreBasinExplorer",
    "ALIGNMENT_CLASSES",
    "JointSVMs",
    "angle_degrees",
    "balanced_direction",
    "classify_alignment",
    "joint_svms",
    "random_joint_tokens",
    "RandomJointRuns",
    "offset_tolerance",
    "random_joint_runs",
    "CROSS_ENTROPY",
    "Reduced",
    "curves",
    "log_steps",
    "logistic_regression",
    "reduce_to_span",
    "separable_data",
    "train_many",
    "DecoderAttention",
    "joint_self_attention",
    "PlantedTokens",
    "planted_tokens",
    "decoder_svms",
    "StackedDecoderAttention",
    "train_decoder_stack",
    "train_joint_problem",
    "half_decade_slopes",
    "inverse_log_vs_power",
    "Comparison",
    "SelectionSweep",
    "compare_methods",
    "late_decay",
    "late_slopes",
    "selection_sweep",
    "DigitPatches",
    "digit_patches",
    "fit_patch_head",
    "follow_selection",
    "SelectionStudy",
    "attention_run",
    "gap_cone_start",
    "nested_svms",
    "score_spread",
    "selection_study",
    "train_problems",
    "CHECK_MIME",
    "STATUSES",
    "Check",
    "boolean",
    "check_parameter",
    "integer",
    "list_of",
    "one_of",
    "real",
    "text",
    "OFFICIAL_RANK_GRID",
    "FactorTrajectory",
    "NuclearSVM",
    "RankGrid",
    "kq_init",
    "nuclear_svm",
    "numerical_rank",
    "rank_instance",
    "svm_constraints",
    "svm_rank_grid",
    "train_kq",
    "LocalPathCase",
    "admissible_cone_angle",
    "cone_margin_bound",
    "cone_min_norm",
    "cone_project",
    "local_path_case",
    "local_regularization_path",
    "selection_log_gap",
    "JointPath",
    "joint_path_bounds",
    "joint_regularization_path",
    "train_joint_stack",
    "SVMBatch",
    "frobenius_svm_batch",
    "nuclear_svm_batch",
    "train_kq_grid",
    "svm_pair_batch",
    "LocalConvergence",
    "local_convergence",
]
