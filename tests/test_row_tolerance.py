"""Row checks at real vocabularies (issue 54): the tolerance follows the dtype and the number of terms summed
(theory.core.checks.row_sum_tol), so honest float32 softmax rows of V = 16,384 and 65,536 codes pass every check that
reads them (verify_chain's boundary, the exact likelihood), and a row off by 1e-3 is still refused (the control)."""
from __future__ import annotations

import numpy as np
import pytest

from theory.core import checks
from theory.likelihood import log_likelihood
from theory.rules import vanilla, verify_chain

torch = pytest.importorskip("torch")


def softmax_rows(V, n, seed, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(n, V, generator=g) * scale, dim=-1)      # float32, as the engine makes them


@pytest.mark.parametrize("V", [16384, 65536])
def test_honest_float32_rows_pass_and_a_wrong_row_is_refused(V):
    p = softmax_rows(V, 64, 0)
    err = float((p.double().sum(-1) - 1).abs().max())
    tol = checks.row_sum_tol(torch.float32, V)
    assert err <= tol < 1e-3, (err, tol)
    assert bool(checks.rows_ok_xp(p, torch)) and bool(checks.rows_ok_xp(p.numpy(), np))
    bad = p.clone()
    bad[3] *= 1.001                                                  # the control: a row summing to 1.001
    assert not bool(checks.rows_ok_xp(bad, torch))
    with pytest.raises(ValueError, match="sum"):
        checks.check_rows_xp("p", bad, torch)


def test_the_checks_that_failed_at_real_sizes_now_pass():
    """verify_chain's boundary check and the exact chain likelihood on float32 softmax rows at V = 65,536, whose sums
    exceed the former eps (1 + log2 V) bound (as CFG-processed rows at 16,384 did: 'p rows must sum to 1 ...
    1.00000321865'): both refused such rows before."""
    V, L = 65536, 3
    p = softmax_rows(V, 2 * (L + 1), 1).reshape(2, L + 1, V)
    q = softmax_rows(V, 2 * L, 2).reshape(2, L, V)
    tok = torch.argmax(q, -1)
    old_bound = float(torch.finfo(torch.float32).eps) * (1 + np.ceil(np.log2(V)))
    assert float((p.double().sum(-1) - 1).abs().max()) > old_bound        # the rows the old check refused
    v = verify_chain(p, q, tok, torch.rand(2, L), torch.rand(2), vanilla(), check=True)
    assert v.accepted.shape == (2,)
    pn, qn = p[:, 0].double().numpy(), q[:, 0].double().numpy()
    ll = log_likelihood(pn[None], qn[None, :, None, :], tok[:, :1].numpy().T, vanilla(), 1)
    assert np.all(np.isfinite(np.asarray(ll)))


def test_the_tolerance_grows_with_V_and_stays_tight_in_float64():
    t = [checks.row_sum_tol(np.float32, V) for V in (256, 1024, 16384, 65536)]
    assert t == sorted(t) and t[-1] < 1e-3
    assert checks.row_sum_tol(np.float64, 65536) == checks.ROW_SUM_TOL
