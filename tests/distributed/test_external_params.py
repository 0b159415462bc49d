"""``apply_zero(..., external_params=...)``: stage-3 parameters read outside their unit's forward train exactly as
one process does, at every stage; undeclared (a returned parameter) or wrongly declared, one line on every rank."""

from __future__ import annotations

import pytest

from tests.distributed.test_user_models import close
from tests.helpers.dist import run_distributed
from tests.helpers.external_params import EXTERNAL, engine_from_a_list, refusals, train_declared
from tests.helpers.tiers import tiered

pytestmark = pytest.mark.dist


@pytest.fixture(scope="module", params=tiered((0, 1, 2, 3), fast=(0, 2, 3)))
def declared(request):
    return request.param, run_distributed(train_declared, 2, request.param, timeout=240)


@pytest.mark.parametrize("variant", sorted(EXTERNAL))
def test_parameters_read_outside_their_unit_train_as_one_process(declared, variant):
    stage, ranks = declared
    for r in ranks:
        got = r[variant]
        assert got["max_update"] > 1e-3 and not got["missing"], got  # the reference moved: not vacuous
        assert close(got), got
        if stage == 3:  # owned by the root, gathered for the whole pass; the other units still exist
            assert set(got["owner"].values()) == {0}, got["owner"]
            assert len(got["units"]) >= 3, got["units"]


@pytest.fixture(scope="module")
def refused():
    return run_distributed(refusals, 2, timeout=180)


@pytest.mark.parametrize(
    "case, words",
    [
        (
            "undeclared",
            (
                "ConfigError: ZeRO stage 3: unit BiasOut returned its own parameter 'a.bias', which is freed when "
                "the unit's forward ends: pass it to apply_zero(..., external_params=['a.bias'])"
            ),
        ),
        ("unknown_name", "ConfigError: external_params: 'a.wieght' is not a parameter of the model"),
        ("foreign", "ConfigError: external_params: a Parameter of shape (2, 2) is not a parameter of the model"),
        ("frozen", "ConfigError: external_params: 'b.bias' is frozen (requires_grad=False)"),
    ],
)
def test_undeclared_or_wrongly_declared_is_one_line(refused, case, words):
    for r in refused:
        assert r[case] is not None and r[case].startswith(words) and "\n" not in r[case], r[case]


def test_deepspeeds_initialize_takes_them_too(refused):
    """The returned bias declared through ``zerobench.zero.initialize``: a step runs (undeclared, it is refused)."""
    assert all(r["via_initialize"] is None for r in refused), refused[0]["via_initialize"]


@pytest.mark.parametrize("case, names", [("read_parent", "'a.weight'"), ("read_method", "'a.weight', 'a.bias'")])
def test_an_undeclared_read_is_named_in_a_note(refused, case, names):
    """A parent reading a child unit's weight, a unit called through another method: the op fails inside torch (it
    cannot be refused), and a note under its message names what was read and the fix."""
    for r in refused:
        assert r[case] is not None, "the forward did not fail"
        assert len(r[case]) == 1 and f"reads {names} outside the forward" in r[case][0], r[case]
        assert f"external_params=[{names}]" in r[case][0], r[case]


def test_an_engine_built_directly_still_takes_a_list_of_units():
    assert run_distributed(engine_from_a_list, 2, timeout=120) == [2, 2]
