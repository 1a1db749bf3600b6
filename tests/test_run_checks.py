"""The host checks of time-stepping runs: growth no stable run allows stops the run, named.

driver.run's ``growth_limit`` (Maxwell and advection runs pass it): y' = −50y with LSERK4 at
λΔt = −10, outside the method's stability region (radius ≈ 5.6 on the negative axis), grows by
|R(−10)| ≈ 160 a step; the run stops at the first chunk whose norm passes the limit, naming that
step, with finite numbers; at λΔt = −2.5 (stable) the same run completes.
"""

import math

import jax.numpy as jnp
import pytest

from jaxsem.solvers import driver
from jaxsem.solvers import timestepping as ts
from jaxsem.solvers.stops import NonFiniteError, RunStopped, UnstableRunError


def f(t, y):
    return -50.0 * y


@pytest.mark.parametrize("chunk", [1, 3])
def test_growth_past_the_limit_stops_the_run_naming_the_step(chunk):
    r = abs(float(ts.stability_function("lserk4", -10.0)))
    assert r > 100  # the premise: unstable
    first = math.ceil(math.log(1e3) / math.log(r))  # the first step past the limit
    with pytest.raises(UnstableRunError, match=r"norm relative to the start = [\d.e+]+ exceeds 1000 at step") as e:
        driver.run(f, jnp.ones(3), 0.2, 100, growth_limit=1e3, options=driver.RunOptions(chunk_steps=chunk))
    assert isinstance(e.value, RunStopped) and e.value.status == "unstable"
    assert e.value.step == chunk * math.ceil(first / chunk)  # checked at chunk ends
    assert math.isclose(e.value.t, 0.2 * e.value.step) and 1e3 < e.value.value < 1e3 * r ** chunk


def test_a_stable_run_is_not_stopped():
    y, info = driver.run(f, jnp.ones(3), 0.05, 40, growth_limit=1.0, options=driver.RunOptions(chunk_steps=4))
    assert info.steps == 40 and float(jnp.max(jnp.abs(y))) < 1e-20


def test_without_the_limit_an_unstable_run_ends_in_the_named_non_finite_step():
    with pytest.raises(NonFiniteError, match="at step") as e:
        driver.run(f, jnp.ones(3), 0.2, 400, options=driver.RunOptions(chunk_steps=50))
    assert e.value.status == "non_finite" and e.value.step > 100


def test_tgv_peak_dissipation_is_reported_only_where_reached():
    """A run that ends while ε still rises has no peak (None), not its last sample; one past it does."""
    import numpy as np

    from jaxsem.app.tgv import _compare
    from jaxsem.models import navier_stokes as NS

    t = np.linspace(0.0, 1.0, 6)

    def series(eps):
        z = np.zeros_like(t)
        cols = dict.fromkeys(NS.Series._fields, z)
        cols.update(time=t, kinetic_energy=0.125 - 0.01 * t, dissipation=np.asarray(eps, float),
                    force=np.zeros((len(t), 0, 3)), probe=np.zeros((len(t), 0, 4)))
        return NS.Series(**cols)

    rising = _compare(series([np.nan, 1.0, 2.0, 3.0, 4.0, 5.0]))
    assert rising["peak_dissipation"] is None and rising["peak_dissipation_time"] is None
    hump = _compare(series([np.nan, 1.0, 3.0, 5.0, 4.0, 2.0]))
    assert hump["peak_dissipation"] == 5.0 and hump["peak_dissipation_time"] == t[3]


def test_tgv_energy_is_compared_between_samples_and_up_to_t12():
    """E_k at t = 5 and 10 between samples that miss those times (linear), None where not reached;
    the largest deviation from the DNS over t <= 12 is the samples' (here the DNS itself + 1 % at t = 7)."""
    import numpy as np

    from jaxsem.app.tgv import _compare
    from jaxsem.models import flows
    from jaxsem.models import navier_stokes as NS

    ref = flows.tgv_reference()
    t = np.arange(0.0, 14.0, 0.35)  # misses 5 and 10 (at 4.9, 5.25; 9.8, 10.15)
    e = ref.at(t).kinetic_energy * np.where(np.isclose(t, 7.0), 1.01, 1.0)
    e[t > 12.0] = 0.0  # past t = 12: not compared
    z = np.zeros_like(t)
    cols = dict.fromkeys(NS.Series._fields, z)
    cols.update(time=t, kinetic_energy=e, dissipation=z, force=np.zeros((len(t), 0, 3)), probe=np.zeros((len(t), 0, 4)))
    r = _compare(NS.Series(**cols))
    assert r["kinetic_energy_t5"] == np.interp(5.0, t, e) and r["kinetic_energy_t10"] == np.interp(10.0, t, e)
    assert abs(r["kinetic_energy_t5"] - r["reference"]["kinetic_energy_t5"]) < 1e-3
    assert r["kinetic_energy_deviation_to_t12"] == pytest.approx(0.01, rel=1e-12)
    short = _compare(NS.Series(**dict(cols, time=t[:20] / 4, kinetic_energy=e[:20])))
    assert short["kinetic_energy_t5"] is None and short["kinetic_energy_t10"] is None


def test_progress_is_shown_by_default_on_a_terminal_or_in_a_notebook(monkeypatch, capsys):
    """RunOptions' default progress is "auto": a bar on a terminal or in a Jupyter kernel, none in a
    pipe (CI, this test); the bar says the first chunk's time (compilation) apart."""
    import io
    import sys

    assert driver.RunOptions().progress == "auto"
    assert driver._show_progress(True) and not driver._show_progress(False)

    class Tty(io.StringIO):
        def isatty(self):
            return True

    err = Tty()
    monkeypatch.setattr(sys, "stderr", err)
    assert driver._show_progress("auto")
    driver.run(f, jnp.ones(3), 0.01, 6, options=driver.RunOptions(chunk_steps=2))
    assert "incl. compile" in err.getvalue()
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    assert not driver._show_progress("auto")
    monkeypatch.setitem(sys.modules, "ipykernel", object())
    assert driver._show_progress("auto")
    with pytest.raises(TypeError, match="progress must be True, False or 'auto'"):
        driver.RunOptions(progress="yes")


def test_tgv_checkpoint_interval_is_refused_before_any_set_up(monkeypatch):
    """run_tgv(checkpoint_every=...) not a whole multiple of sample, or without a checkpoint path:
    a ValueError naming it, before the discretization is built."""
    from jaxsem.app import tgv

    def no_setup(*a, **k):
        raise AssertionError("checkpoint_every must be checked before the set-up")

    monkeypatch.setattr(tgv, "box_mesh", no_setup)
    for kw in (dict(checkpoint="ck.npz", checkpoint_every=0.15), dict(checkpoint_every=0.2),
               dict(checkpoint="ck.npz", checkpoint_every=0.0)):
        with pytest.raises(ValueError, match=r"checkpoint_every must be a whole multiple of sample \(0\.1\)"):
            tgv.run_tgv(2, (2, 2, 2), 1.0, **kw)
