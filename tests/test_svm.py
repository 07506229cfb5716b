"""Max-margin problems against independent solvers, and the paper's local-optimality verdicts."""

import itertools

import numpy as np
import pytest
from scipy.optimize import nnls

import attnlib as al
import attnlib.svm


def least_distance(G, h):
    """``min ‖x‖ s.t. G x ≥ h`` by Lawson–Hanson's reduction to NNLS; ``None`` if infeasible."""
    m, d = G.shape
    E = np.vstack([G.T, h[None, :]])
    f = np.zeros(d + 1)
    f[-1] = 1.0
    u, _ = nnls(E, f, maxiter=50 * m)
    r = E @ u - f
    if np.linalg.norm(r) < 1e-10:
        return None
    return -r[:d] / r[d]


def constraint_rows(prob, select, relax=()):
    A = prob.A.reshape(prob.n, prob.T, -1)
    G, h = [], []
    for i in range(prob.n):
        for t in range(prob.T):
            if t != select[i]:
                G.append(A[i, select[i]] - A[i, t])
                h.append(0.0 if i in relax else 1.0)
    return np.array(G), np.array(h)


def random_problem(seed, n, T, d):
    rng = np.random.default_rng(seed)
    return al.prompt_attention(rng.normal(size=(n, T, d)), rng.choice([-1, 1], n), rng.normal(size=d))


# solver="cvxpy" (an interior-point solve of the QP) against the test's own Lawson-Hanson
# least-distance solve: two independent methods. solver="auto" is the library's NNLS fast path,
# which is also checked against cvxpy below.
@pytest.mark.parametrize("solver", ["cvxpy", "auto"])
@pytest.mark.parametrize("seed", range(8))
def test_att_svm_matches_least_distance_solve(seed, solver):
    # d = 6 against n(T-1) = 12 rows: some instances are feasible, some are not.
    prob = random_problem(seed, n=4, T=4, d=6)
    rng = np.random.default_rng(100 + seed)
    for select in (prob.opt, rng.integers(0, prob.T, prob.n)):
        G, h = constraint_rows(prob, select)
        reference = least_distance(G, h)
        if reference is None:
            with pytest.raises(al.InfeasibleError, match="infeasible for selection"):
                al.max_margin(prob, select, solver=solver)
            continue
        sol = al.max_margin(prob, select, solver=solver)
        assert sol.status == "optimal"
        np.testing.assert_allclose(sol.theta, reference, atol=1e-7)
        assert np.all(G @ sol.theta >= 1 - 1e-8)
        assert sol.margin == pytest.approx(1 / np.linalg.norm(reference), rel=1e-7)


def test_feasible_and_infeasible_instances_both_occur():
    verdicts = set()
    for seed in range(8):
        prob = random_problem(seed, n=4, T=4, d=6)
        G, h = constraint_rows(prob, prob.opt)
        verdicts.add(least_distance(G, h) is None)
    assert verdicts == {True, False}


@pytest.mark.parametrize("solver", ["cvxpy", "auto"])
def test_relaxed_rows_match_least_distance_solve(solver):
    prob = random_problem(3, n=4, T=3, d=8)
    G, h = constraint_rows(prob, prob.opt, relax=(1, 2))
    sol = al.max_margin(prob, relax=[1, 2], solver=solver)
    np.testing.assert_allclose(sol.theta, least_distance(G, h), atol=1e-7)
    assert sol.relax.tolist() == [False, True, True, False]


def test_neighbors_agree_with_positive_duals():
    prob = random_problem(5, n=3, T=5, d=12)
    sol = al.max_margin(prob)
    strongly_active = sol.duals > 1e-6
    assert np.all(sol.neighbors[strongly_active])
    assert not np.any(sol.neighbors[np.arange(prob.n), sol.select])


@pytest.mark.parametrize("solver", ["cvxpy", "auto"])
def test_self_attention_frobenius_svm_matches_least_distance(solver):
    prob = al.datasets.random_tokens(n=3, T=4, d=5, seed=0)
    G, h = constraint_rows(prob, prob.opt)
    sol = al.max_margin(prob, solver=solver)
    np.testing.assert_allclose(sol.theta.ravel(), least_distance(G, h), atol=1e-7)


@pytest.mark.parametrize("seed", range(3))
def test_nuclear_svm_is_certified_by_its_dual(seed):
    """min ‖W‖_* s.t. ⟨W, D_k⟩ ≥ 1 has dual max Σλ s.t. ‖Σ λ_k D_k‖_op ≤ 1, λ ≥ 0.

    A feasible primal and dual with equal objectives certify optimality independently of the solver.
    """
    prob = al.datasets.random_tokens(n=3, T=4, d=5, seed=seed)
    sol = al.max_margin(prob, norm="nuc")
    rows = ~np.eye(prob.T, dtype=bool)[prob.opt]
    D = (prob.A[np.arange(prob.n), prob.opt][:, None] - prob.A)[rows]  # (m, d, d)
    lam = sol.duals[rows]
    assert np.all(np.einsum("kij,ij->k", D, sol.theta) >= 1 - 1e-7)  # primal feasible
    assert np.all(lam >= -1e-9)
    dual_matrix = np.einsum("k,kij->ij", lam, D)
    assert np.linalg.norm(dual_matrix, 2) <= 1 + 1e-6  # dual feasible
    assert np.linalg.norm(sol.theta, "nuc") == pytest.approx(lam.sum(), rel=1e-6)  # zero duality gap
    fro = al.max_margin(prob, norm="fro")
    assert np.linalg.norm(sol.theta, "nuc") <= np.linalg.norm(fro.theta, "nuc") + 1e-7


def test_nuclear_norm_needs_a_matrix():
    with pytest.raises(ValueError, match="norm='nuc' needs a matrix parameter"):
        al.max_margin(al.datasets.single_input(), norm="nuc")


def test_label_svm_matches_least_distance():
    rng = np.random.default_rng(0)
    X = rng.normal(size=(6, 4))
    y = np.sign(X @ rng.normal(size=4))
    sv = al.label_svm(X, y)
    reference = least_distance(y[:, None] * X, np.ones(6))
    np.testing.assert_allclose(sv.v, reference, atol=1e-7)
    assert sv.support.any()


def test_label_svm_support_vectors_of_the_joint_data():
    X, y = al.datasets.joint_tokens(relaxed=False)
    assert al.label_svm(X[:, 1], y).support.tolist() == [True, True, True]
    X, y = al.datasets.joint_tokens(relaxed=True)
    sv = al.label_svm(X[:, 1], y)
    assert sv.support.tolist() == [True, True, False]
    np.testing.assert_allclose(sv.v, [0.0, 1.0], atol=1e-8)


def test_fig1b_local_optimality_table():
    """[MMTS] Fig. 1(b): selections 0 and 1 are locally optimal, selection 2 is feasible but not."""
    prob = al.datasets.single_input(local=True)
    reports = {r.select: r for r in al.enumerate_selections(prob)}
    assert [reports[(k,)].feasible for k in range(3)] == [True, True, True]
    assert [reports[(k,)].locally_optimal for k in range(3)] == [True, True, False]
    np.testing.assert_allclose(reports[(0,)].solution.theta[:2], [-10 / 101, 100 / 101], atol=1e-8)
    np.testing.assert_allclose(reports[(1,)].solution.theta[:2], [1.0, 0.0], atol=1e-8)
    np.testing.assert_allclose(reports[(2,)].solution.theta[:2], [-1.0, -1.1], atol=1e-8)
    assert reports[(1,)].solution.neighbors.tolist() == [[False, False, True]]
    assert reports[(2,)].solution.neighbors.tolist() == [[True, True, False]]
    assert [r.select for r in al.svm.locally_optimal_selections(prob)] == [(0,), (1,)]


def test_fig1a_tie_makes_the_local_selection_not_locally_optimal():
    prob = al.datasets.single_input(local=False)
    assert al.svm.is_locally_optimal(prob, [0])
    assert not al.svm.is_locally_optimal(prob, [1])  # its neighbour (0, 0) ties at score 0.9
    assert not al.svm.is_locally_optimal(prob, [2])


def test_enumeration_refuses_huge_problems():
    prob = al.datasets.random_tokens(n=6, T=8, d=10, seed=0)
    with pytest.raises(ValueError, match="cannot enumerate T\\^n = 8\\^6"):
        al.enumerate_selections(prob)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(select=[5]), "token indices in \\[0, 2\\]"),
        (dict(select=[0, 1]), "select must be 1 integer token indices"),
        (dict(norm="l1"), "norm must be 'fro' or 'nuc'"),
        (dict(relax=[3]), "relax must hold sample indices"),
    ],
)
def test_bad_svm_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        al.max_margin(al.datasets.single_input(), **kwargs)


# The exact NNLS fast path of max_margin against cvxpy (solver="cvxpy"), the independent solve.
def _solve_both(prob, select, relax):
    out = []
    for solver in ("auto", "cvxpy"):
        try:
            out.append(al.max_margin(prob, select, relax=relax, solver=solver))
        except al.InfeasibleError:
            out.append(None)
    return out


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("size", [(6, 8, 10), (3, 5, 4), (5, 5, 3)])
def test_frobenius_fast_path_matches_cvxpy(seed, size):
    """The NNLS least-distance solve gives cvxpy's answer, its neighbours and its infeasibility verdicts."""
    prob = al.datasets.random_tokens(*size, seed=seed)
    rng = np.random.default_rng(seed)
    for select in (prob.opt, rng.integers(0, prob.T, size=prob.n)):
        fast, ref = _solve_both(prob, select, relax=None)
        assert (fast is None) == (ref is None)
        if ref is None:
            continue
        scale = np.linalg.norm(ref.theta)
        np.testing.assert_allclose(fast.theta, ref.theta, atol=1e-6 * scale)
        assert fast.margin == pytest.approx(ref.margin, rel=1e-6)
        assert fast.status == "optimal"
        # The fast solve meets every constraint (exactly, up to rounding, on the active ones).
        off = np.ones((prob.n, prob.T), bool)
        off[np.arange(prob.n), select] = False
        assert fast.constraint_values[off].min() >= 1 - 1e-9
        # Active sets agree except where cvxpy's own accuracy blurs a constraint across ACTIVE_TOL.
        differ = fast.neighbors != ref.neighbors
        assert np.all(np.abs(ref.constraint_values[differ] - 1) < 1e-5)


def test_frobenius_fast_path_relaxed_rows_and_label_svm():
    prob = al.datasets.random_tokens(4, 5, 8, seed=3)
    fast, ref = _solve_both(prob, prob.opt, relax=[1, 2])
    np.testing.assert_allclose(fast.theta, ref.theta, atol=1e-6 * np.linalg.norm(ref.theta))
    assert fast.relax.tolist() == ref.relax.tolist()
    sv = al.label_svm([[1.0, 1.0], [1.0, -1.0], [0.5, 1.0]], [1, -1, 1])
    np.testing.assert_allclose(sv.v, [0.0, 1.0], atol=1e-12)
    assert sv.support.tolist() == [True, True, True]


def test_fast_path_certifies_infeasibility_like_cvxpy():
    # Two samples that need opposite directions: infeasible. NNLS returns a Farkas certificate
    # (margin bound 0), so no cvxpy is needed; cvxpy (solver="cvxpy") gives the same verdict.
    X = np.array([[[1.0, 0.0], [0.0, 0.0]], [[-1.0, 0.0], [0.0, 0.0]]])
    prob = al.prompt_attention(X, [1, 1], v=[1.0, 0.0])
    G = np.array([[1.0, 0.0], [-1.0, 0.0]])
    assert attnlib.svm._least_distance(G, np.ones(2)) == "infeasible"
    for solver in ("auto", "cvxpy"):
        with pytest.raises(al.InfeasibleError):
            al.max_margin(prob, select=np.array([1, 1]), solver=solver)
    # a feasible problem with badly scaled rows (1e-6·x ≥ 1e-6 and x ≥ 1) still gets its point x = 1
    x, _ = attnlib.svm._least_distance(np.array([[1e-6], [1.0]]), np.array([1e-6, 1.0]))
    np.testing.assert_allclose(x, [1.0], rtol=1e-12)


def test_least_distance_nnls_gives_the_point_or_a_farkas_certificate():
    from attnlib.svm import least_distance_nnls

    rng = np.random.default_rng(3)
    G, h = rng.normal(size=(6, 4)), np.abs(rng.normal(size=6))
    u, r = least_distance_nnls(G, h)
    x = -r[:-1] / r[-1]
    assert np.all(G @ x >= h - 1e-9) and np.allclose(x, G.T @ (u / -r[-1]))
    # x ≥ 1 and −x ≥ 1 cannot both hold: G^T u = 0 with h^T u = 1 certifies it.
    u, r = least_distance_nnls(np.array([[1.0], [-1.0]]), np.array([1.0, 1.0]))
    assert abs(r[-1]) < 1e-12 and abs(u[0] - u[1]) < 1e-12 and u.sum() == pytest.approx(1.0)


def test_nnls_infeasibility_certificates_agree_with_clarabel():
    """Every selection of small problems with few parameters (many infeasible): the NNLS path's
    verdict (Farkas certificate, no cvxpy) equals CLARABEL's, and so does the label SVM's."""
    import attnlib as al

    verdicts = {"auto": [], "cvxpy": []}
    for seed in range(3):
        prob = al.datasets.random_tokens(3, 3, 2, seed=seed)  # p-problems in d=2: many infeasible selections
        for sel in itertools.product(range(prob.T), repeat=prob.n):
            for solver in verdicts:
                try:
                    al.max_margin(prob, np.array(sel), solver=solver)
                    verdicts[solver].append(True)
                except al.InfeasibleError:
                    verdicts[solver].append(False)
    assert verdicts["auto"] == verdicts["cvxpy"]
    assert 0 < sum(verdicts["auto"]) < len(verdicts["auto"])  # both verdicts occur
    X = np.array([[1.0, 0.0], [-1.0, 0.0], [0.0, 1.0]])  # x and −x both labelled +1: no v separates
    with pytest.raises(al.InfeasibleError):
        al.label_svm(X, [1, 1, -1])
    assert al.svm.farkas_margin_bound(X * np.array([[1], [1], [-1]]), np.ones(3), np.array([1.0, 1.0, 0.0])) == 0.0
