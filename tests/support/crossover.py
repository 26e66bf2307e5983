"""Simulated crossover studies (AB, BA, … pairs of phases) in numpy: the phases' design and
the arm + position fit the analysis makes, for the simulations of the decision rule."""

import numpy as np

from thermab.analysis import sequential

PERIOD = 0.5  # the drift per position in the order, in sd (the study's throughput had −0.7 sd)


def design(repeats: int) -> tuple[np.ndarray, np.ndarray]:
    """(is B, position) of every phase in time order over ``repeats`` crossover repeats."""
    orders = [sequential.order_of_repeat("AB", rep) for rep in range(1, repeats + 1)]
    is_b = np.array([arm == "B" for order in orders for arm in order], float)
    position = np.array([order.index(arm) for order in orders for arm in order], float)
    return is_b, position


def least_squares(y: np.ndarray, is_b: np.ndarray, position: np.ndarray):
    """B − A of ``value ~ arm + position`` for every row of ``y`` at once (what
    stats.arm_period_fit fits, here in numpy: 100,000 formula fits would take an hour):
    (estimates, their se, residual df)."""
    x = np.c_[np.ones(len(is_b)), is_b, position]
    inverse = np.linalg.inv(x.T @ x)
    beta = y @ (inverse @ x.T).T
    residual = y - beta @ x.T
    df = len(is_b) - x.shape[1]
    se = np.sqrt((residual**2).sum(axis=1) / df * inverse[1, 1])
    return beta[:, 1], se, df


def adjusted_least_squares(
    y: np.ndarray,
    is_b: np.ndarray,
    position: np.ndarray,
    covariate: np.ndarray | None,
    shorter: np.ndarray | None = None,
):
    """B − A of ``value ~ arm + position + window + covariate`` for every row of ``y``, each row
    with its own ``covariate`` (what stats.covariate_effects fits; None: none), and with a
    window term where ``shorter`` (which phases ran the shorter window, one pattern shared by
    the rows) holds both kinds: (estimates, se, residual df)."""
    ones = np.ones(y.shape)
    columns = [ones, ones * is_b, ones * position]
    if shorter is not None and 0 < shorter.sum() < len(shorter):
        columns.append(ones * shorter)
    if covariate is not None:
        columns.append(covariate)
    x = np.stack(columns, axis=2)
    gram_inverse = np.linalg.inv(np.einsum("npk,npl->nkl", x, x))
    beta = np.einsum("nkl,npl,np->nk", gram_inverse, x, y)
    residual = y - np.einsum("npk,nk->np", x, beta)
    df = x.shape[1] - x.shape[2]
    se = np.sqrt((residual**2).sum(axis=1) / df * gram_inverse[:, 1, 1])
    return beta[:, 1], se, df
