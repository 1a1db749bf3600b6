"""The ``jaxsem`` command's text reports: one function per result kind, a record (dict) in,
lines out."""

from __future__ import annotations

import math

__all__ = ["report_solve", "report_maxwell", "report_advection", "report_tgv", "report_kovasznay", "report_rbc", "report_channel", "report_cylinder",
           "report_bench", "report_info"]

def _fmt_device(r: dict) -> str:
    return r["platform"] if r["device"] == r["platform"] else f"{r['platform']} ({r['device']})"


def _fmt_where(r: dict) -> str:
    """Where a solve ran, for the reports: device kind, devices used, transport, processes."""
    return (f"{_fmt_device(r)}, {r['devices']} of {r['num_devices']} device(s), {r['transport']} transport, "
            f"{r['ranks']} process(es), jax {r['jax_version']}")


def _fmt_precond(r: dict) -> str:
    if r["precond"] == "jacobi":
        return "Jacobi preconditioner"
    orders = " > ".join(map(str, r["pmg_orders"]))
    prec = f", {r['pmg_dtype']} cycle" if r.get("pmg_dtype") and r["pmg_dtype"] != r.get("dtype") else ""
    return f"p-multigrid preconditioner (orders {orders}{prec}, setup {r['setup_seconds']:.2f} s)"


def _fmt_rate(x) -> str:
    return "n/a" if x is None or not math.isfinite(x) else f"{x:.3e}"


# ----------------------------------------------------------------------------- solve

def report_solve(r: dict) -> str:
    el = "x".join(map(str, r["elements"]))
    bc = "Dirichlet" if r["operator"] == "stiffness" else "Neumann"
    quad = "GLL" if r["quadrature"] == "gll" else "Gauss"
    field = "3-vector" if r["components"] == 3 else "scalar"
    status = "converged" if r["converged"] else "NOT converged"
    return "\n".join([
        f"jaxsem {r['jaxsem_version']}: Poisson BP{r['bp']} ({field} {r['operator']}, {quad} quadrature, "
        f"{bc}) on the unit box",
        f"  mesh        order {r['order']}, {el} elements, deform {r['deform']}, {r['dtype']}",
        f"  DOFs        {r['dofs']} (components x E x p^3)",
        f"  PCG         {r['iterations']} iterations, {status} (tol {r['tol']:g}, "
        f"relative residual {r['residual']:.2e}), {_fmt_precond(r)}",
        f"  error       relative L2 {r['error_l2']:.3e}, max {r['error_max']:.3e}",
        f"  time        {r['seconds']:.4f} s solve ({_fmt_rate(r['dofs_per_second'])} DOFs/s), "
        f"{r['compile_seconds']:.2f} s compile, {r['backend']} element kernels",
        f"  device      {_fmt_where(r)}",
    ])


def report_maxwell(r: dict) -> str:
    el = "x".join(map(str, r["elements"]))
    case = "PEC cavity mode (1,1,1)" if r["bc"] == "pec" else "periodic plane wave k=2pi(1,1,0)"
    lines = [
        f"jaxsem {r['jaxsem_version']}: Maxwell SEDG, {case} in the unit box, {r['flux']} flux",
        f"  mesh        order {r['order']}, {el} elements, deform {r['deform']}, {r['dtype']}",
        f"  DOFs        {r['dofs']} per field component (E x p^3; 6 components)",
    ]
    if not r["converged"]:
        return "\n".join(lines + [f"  BLOW-UP     {r['message']}"])
    return "\n".join(lines + [
        f"  time        t_final {r['t_final']:g}: {r['steps']} {r['method']} steps, dt {r['dt']:.3e} "
        f"(cfl {r['cfl']:g} of the stable limit {r['dt_limit']:.3e})",
        f"  error       relative L2 {r['error_l2']:.3e} (E, H vs exact), energy ratio {r['energy_ratio']:.12f}",
        f"  speed       {r['seconds']:.4f} s stepping ({_fmt_rate(r['gflops'])} GFLOPS, NekCEM model), "
        f"{r['compile_seconds']:.2f} s setup+compile",
        f"  device      {_fmt_where(r)}",
    ])


def report_advection(r: dict) -> str:
    el = "x".join(map(str, r["elements"]))
    c = " ".join(f"{v:g}" for v in r["velocity"])
    lines = [
        f"jaxsem {r['jaxsem_version']}: advection DG, periodic Gaussian (width {r['width']:g}) in the unit box, "
        f"velocity ({c}), {r['flux']} flux",
        f"  mesh        order {r['order']}, {el} elements, deform {r['deform']}, {r['dtype']}",
        f"  DOFs        {r['dofs']} (E x p^3)",
    ]
    if not r["converged"]:
        return "\n".join(lines + [f"  BLOW-UP     {r['message']}"])
    return "\n".join(lines + [
        f"  time        t_final {r['t_final']:g}: {r['steps']} {r['method']} steps, dt {r['dt']:.3e} "
        f"(cfl {r['cfl']:g} of the stable limit {r['dt_limit']:.3e})",
        f"  error       relative L2 {r['error_l2']:.3e} (vs the exact translated Gaussian), "
        f"mass drift {r['mass_drift']:.1e}, energy ratio {r['energy_ratio']:.12f}",
        f"  speed       {r['seconds']:.4f} s stepping, {r['compile_seconds']:.2f} s setup+compile",
        f"  device      {_fmt_where(r)}",
    ])


def _pct(v):
    return None if v is None else 100 * v


def report_tgv(r: dict) -> str:
    el = "x".join(map(str, r["elements"]))
    lines = [f"jaxsem {r['jaxsem_version']}: Taylor-Green vortex, Re {r['reynolds']:g}, periodic [-pi, pi]^3",
             f"  mesh        order {r['order']}, {el} elements, {r['dofs']} points, BDF{r['time_order']}/EXT"
             f"{r['time_order']}, dt {r['dt']:.4g}"]
    if not r["converged"]:
        return "\n".join(lines + [f"  FAILED      {r['message']}"])
    ref = r.get("reference") or {}
    fmt = lambda v: "-" if v is None else f"{v:.5g}"
    lines += [
        f"  t_final     {r['t_final']:g}: {r['steps']} steps in {r['seconds']:.2f} s including the first chunk's "
        f"compilation ({1e3 * r['seconds_per_step']:.2f} ms per step), setup {r['setup_seconds']:.1f} s",
        f"  E_k         {fmt(r['kinetic_energy'][-1])} at t_final; t = 5: {fmt(r['kinetic_energy_t5'])} "
        f"(DNS {fmt(ref.get('kinetic_energy_t5'))}), t = 10: {fmt(r['kinetic_energy_t10'])} "
        f"(DNS {fmt(ref.get('kinetic_energy_t10'))}); "
        f"largest deviation to t = 12 {fmt(_pct(r.get('kinetic_energy_deviation_to_t12')))} %",
        f"  peak eps    {fmt(r['peak_dissipation'])} at t = {fmt(r['peak_dissipation_time'])} "
        f"(DNS {fmt(ref.get('peak_dissipation'))} at t = {fmt(ref.get('peak_dissipation_time'))})",
        f"  solves      pressure {fmt(r['pressure_iterations'][-1])}, velocity {fmt(r['velocity_iterations'][-1])} "
        f"iterations (last step); max CFL {fmt(max(c for c in r['cfl'] if c is not None))}",
        f"  device      {_fmt_where(r)}",
    ]
    return "\n".join(lines)


def _fmt_run(r: dict) -> str:
    """How a Navier-Stokes run to a steady state or t_final went: status, steps, time."""
    ends = dict(steady=lambda: f"steady at t = {r['t']:.4g} (change < {r['steady_tol']:g})",
                t_final=lambda: f"t_final {r['t']:g}", no_period=lambda: f"t_final {r['t']:g}, no full period")
    end = ends[r["status"]]() if r["status"] in ends else r["status"]
    return (f"{end}: {r['steps']} steps in {r['seconds']:.2f} s including the first "
            f"chunk's compilation ({1e3 * r['seconds_per_step']:.2f} ms per step), setup {r['setup_seconds']:.1f} s")


def report_kovasznay(r: dict) -> str:
    el = "x".join(map(str, r["elements"]))
    lines = [f"jaxsem {r['jaxsem_version']}: Kovasznay flow, Re {r['reynolds']:g}, {r['outflow']} outflow on xmax",
             f"  mesh        order {r['order']}, {el} elements, {r['dofs']} points, BDF{r['time_order']}/EXT"
             f"{r['time_order']}, dt {r['dt']:.4g}"]
    if not r["converged"]:
        return "\n".join(lines + [f"  FAILED      {r['message']}"])
    return "\n".join(lines + [
        f"  run         {_fmt_run(r)}",
        f"  error       relative L2 velocity {r['error_l2_velocity']:.3e}, pressure {r['error_l2_pressure']:.3e}; "
        f"divergence {_fmt_rate(r['divergence'])}, change {_fmt_rate(r['change'])}",
        f"  device      {_fmt_where(r)}",
    ])


def report_rbc(r: dict) -> str:
    el = "x".join(map(str, r["elements"]))
    lines = [f"jaxsem {r['jaxsem_version']}: Rayleigh-Benard, Ra {r['rayleigh']:g}, Pr {r['prandtl']:g}, "
             f"k {r['wavenumber']:g} (rigid walls: Ra_c = {r['critical_rayleigh']:g})",
             f"  mesh        order {r['order']}, {el} elements, {r['dofs']} points, BDF{r['time_order']}/EXT"
             f"{r['time_order']}, dt {r['dt']:.4g}"]
    if not r["converged"]:
        return "\n".join(lines + [f"  FAILED      {r['message']}"])
    sigma = r["growth_rate"]
    trend = "none" if sigma is None else ("grows" if sigma > 0 else "decays")
    return "\n".join(lines + [
        f"  run         {_fmt_run(r)}",
        f"  growth      sigma {_fmt_rate(sigma)} at t = {r['t']:g} (the roll {trend}); Nusselt {r['nusselt']:.6f}",
        f"  device      {_fmt_where(r)}",
    ])


def report_channel(r: dict) -> str:
    el = "x".join(map(str, r["elements"]))
    lines = [f"jaxsem {r['jaxsem_version']}: channel, Re_b {r['reynolds_bulk']:g} (DNS: Re_tau "
             f"{r['reference']['re_tau']:g} at Re_b {r['reference']['re_bulk']:g})",
             f"  mesh        order {r['order']}, {el} elements, {r['dofs']} points, BDF{r['time_order']}/EXT"
             f"{r['time_order']}, dt {r['dt']:.4g}"]
    if not r["converged"]:
        return "\n".join(lines + [f"  FAILED      {r['message']}"])
    lines.append(f"  run         {_fmt_run(r)}")
    if r["re_tau"] is None:
        return "\n".join(lines + [f"  averages    none (--average-from {r['average_from']:g} not reached)"])
    c, ref = r["comparison"], r["reference"]
    up = ", ".join(f"{k}: {v:.2f}" for k, v in c["u_plus"].items())
    return "\n".join(lines + [
        f"  averages    {r['samples_averaged']} samples from t = {r['average_from']:g}; Re_tau {c['re_tau']:.2f} "
        f"(from the pressure gradient {c['re_tau_from_gradient']:.2f}; DNS {ref['re_tau']:g})",
        f"  U+          at y+ {up}; centre {c['u_plus_centre']:.2f} (DNS 5.11, 13.87, 17.09; {ref['u_plus_centre']:g})",
        f"  stresses    peak u_rms+ {c['u_rms_peak']:.3f} (DNS {ref['u_rms_peak']:g}), peak -<u'v'>+ "
        f"{c['uv_peak']:.3f} (DNS {ref['uv_peak']:g})",
        f"  device      {_fmt_where(r)}",
    ])


def report_cylinder(r: dict) -> str:
    lines = [f"jaxsem {r['jaxsem_version']}: DFG cylinder {r['case']}, Re {r['reynolds']:g} (Schaefer & Turek 1996)",
             f"  mesh        order {r['order']}, level {r['level']}, {r['elements']} elements, {r['dofs']} points, "
             f"BDF{r['time_order']}/EXT{r['time_order']}, dt {r['dt']:.4g}"]
    if not r["converged"]:
        return "\n".join(lines + [f"  FAILED      {r['message']}"])
    ref, ok = r["reference"], r["within_reference"]
    fmt = lambda v: "-" if v is None else f"{v:.5g}"  # noqa: E731
    names = dict(c_D="drag_coefficient", c_L="lift_coefficient", dp="delta_p", c_D_max="drag_coefficient_max",
                 c_L_max="lift_coefficient_max", St="strouhal")
    lines.append(f"  run         {_fmt_run(r)}")
    lines.append(f"  final       c_D {fmt(r['drag_coefficient'])}, c_L {fmt(r['lift_coefficient'])}, "
                 f"dp {fmt(r['delta_p'])} Pa, change {_fmt_rate(r['change'])}")
    for key, (lo, hi) in ref.items():
        v, name = r.get(names[key]), names[key]
        band = f"{lo:g}" if lo == hi else f"{lo:g}..{hi:g}"
        verdict = "-" if ok.get(name) is None else ("within" if ok[name] else "OUTSIDE")
        dev = r["reference_deviation"].get(name)
        off = "" if dev is None else f", {100 * dev:+.2f}% from its middle"
        lines.append(f"  {key:<11} {fmt(v)} (reference {band}: {verdict}{off})")
    if r.get("message"):
        lines.append(f"  note        {r['message']}")
    lines.append(f"  device      {_fmt_where(r)}")
    return "\n".join(lines)


def report_bench(r: dict) -> str:
    el = "x".join(map(str, r["elements"]))
    lines = [
        f"jaxsem {r['jaxsem_version']}: {r['problem'].upper()}, order {r['order']}, {el} elements, "
        f"{r['dtype']}",
        f"  DOFs        {r['dofs']} (components x E x p^3)",
    ]
    if r["problem"].startswith("bp"):
        lines.append(f"  time        {r['seconds']:.4g} s per {r['iterations']}-iteration solve "
                     f"(median of {r['repeats']}), compile {r['compile_seconds']:.2f} s")
    else:
        lines.append(f"  time        {r['seconds']:.4g} s per apply (median of {r['repeats']}), "
                     f"compile {r['compile_seconds']:.2f} s")
    lines.append(f"  rate        {_fmt_rate(r['dofs_per_second'])} DOFs/s, model "
                 f"{r['bytes_per_dof']:.1f} B/DOF -> {r['bytes_per_second'] / 1e9:.1f} GB/s")
    if "percent_of_ceiling" in r:
        lines.append(f"  ceiling     {r['bandwidth'] / 1e9:.1f} GB/s -> "
                     f"{_fmt_rate(r['ceiling_dofs_per_second'])} DOFs/s, "
                     f"{r['percent_of_ceiling']:.1f}% of it")
    if "tts_seconds" in r:
        lines.append(f"  to {r['tts_tol']:g}     {r['tts_seconds']:.4g} s, {r['tts_iterations']} p-multigrid PCG "
                     f"iterations (Jacobi: {r['tts_jacobi_iterations']}), setup {r['tts_setup_seconds']:.2f} s")
    lines.append(f"  device      {_fmt_device(r)}, jax {r['jax_version']}")
    return "\n".join(lines)


def report_info(r: dict) -> str:
    return "\n".join([
        f"jaxsem {r['jaxsem_version']} (python {r['python_version']})",
        f"  jax {r['jax_version']}, jaxlib {r['jaxlib_version']}, numpy {r['numpy_version']}, x64 {r['x64']}",
        f"  devices     {r['num_devices']} x {_fmt_device(r)}: {', '.join(r['devices'])}",
        f"  MPI         mpi4jax {'available' if r['mpi4jax_available'] else 'not installed'}, "
        f"mpi4py {'available' if r['mpi4py_available'] else 'not installed'}",
    ])
