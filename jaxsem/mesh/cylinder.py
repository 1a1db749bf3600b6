"""The flow-around-a-cylinder benchmarks of Schäfer & Turek (1996): constants and meshes.

M. Schäfer, S. Turek, *Benchmark computations of laminar flow around a cylinder*, in
E. H. Hirschel (ed.), Flow Simulation with High-Performance Computers II, Notes on
Numerical Fluid Mechanics 52, Vieweg 1996, pp. 547–566 (the "DFG benchmark").

Geometry (SI units, density 1 kg/m³): a channel of height H = 0.41 m with a cylinder of
diameter D = 0.1 m, centre 0.2 m above the bottom wall (0.01 m off the centre line, so the
wake is not symmetric): 2-D, the channel [0, 2.2] × [0, 0.41] with the centre (0.2, 0.2);
3-D, the square duct [0, 2.5] × [0, 0.41] × [0, 0.41] with the cylinder's axis along z
through (0.5, 0.2).

The meshes are all-hexahedral and second order (hex27, the cylinder surface's mid-nodes on
the circle), built with the ``gmsh`` Python API (``pip install 'jaxsem[gmsh]'``) from
structured blocks: an O-grid ring of four blocks between the cylinder and the square
[cx − 0.1, cx + 0.1] × [cy − 0.1, cy + 0.1], and eight transfinite blocks around it, with
elements growing away from the cylinder (radially in the ring by :data:`RING_GROWTH`,
downstream by :data:`WAKE_GROWTH`). Level 0 has 4 elements per quarter of the cylinder,
3 radially, 176 quadrilaterals in the 2-D plane and 184 in the 3-D cross-section; each
level doubles every division. The 2-D mesh is one element deep in z (periodic through
:func:`dfg_mesh`), the 3-D one has ``4 · 2**level`` layers.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
import types

import numpy as np

from .box import Mesh
from .gmsh import read_gmsh
from .periodic import make_periodic

__all__ = ["DFGGeometry", "DFGCase", "DFG_2D", "DFG_3D", "DFG_2D_1", "DFG_2D_2", "DFG_3D_1Z",
           "RING_GROWTH", "WAKE_GROWTH", "dfg_2d", "dfg_3d", "dfg_mesh"]


@dataclasses.dataclass(frozen=True)
class DFGGeometry:
    """Channel and cylinder of the DFG benchmark (Schäfer & Turek 1996), in metres.

    Attributes:
      dim: 2 (channel [0, length] × [0, height]) or 3 (duct [0, length] × [0, height]²,
        the cylinder's axis along z).
      length: channel length L (x).
      height: channel height H (y; in 3-D also the width in z).
      centre: ``(x, y)`` of the cylinder's centre.
      diameter: cylinder diameter D.
      dp_points: the two points whose pressure difference Δp = p(a) − p(b) the benchmark
        reports (in front of and behind the cylinder), ``((3,), (3,))`` (z = 0 in 2-D).
    """

    dim: int
    length: float
    height: float
    centre: tuple
    diameter: float
    dp_points: tuple

    @property
    def radius(self) -> float:
        return self.diameter / 2

    @property
    def volume(self) -> float:
        """Fluid area (2-D, m², per unit depth) or volume (3-D, m³): the channel less the cylinder."""
        area = self.length * self.height - np.pi * self.radius**2
        return area if self.dim == 2 else area * self.height


DFG_2D = DFGGeometry(2, 2.2, 0.41, (0.2, 0.2), 0.1, ((0.15, 0.2, 0.0), (0.25, 0.2, 0.0)))
DFG_3D = DFGGeometry(3, 2.5, 0.41, (0.5, 0.2), 0.1, ((0.45, 0.2, 0.205), (0.55, 0.2, 0.205)))


@dataclasses.dataclass(frozen=True)
class DFGCase:
    """One test case of the DFG benchmark: inflow, viscosity and the published reference values.

    Schäfer & Turek (1996), *Benchmark computations of laminar flow around a cylinder*
    (Notes Numer. Fluid Mech. 52, 547–566). Density ρ = 1, kinematic viscosity ν = 1e-3 m²/s;
    no-slip on the walls and the cylinder, "do nothing" at the outlet x = L. Inflow at x = 0:
    U(y) = 4 Um y (H − y) / H² (2-D), U(y, z) = 16 Um y z (H − y)(H − z) / H⁴ (3-D), of mean
    Ū = 2/3 Um (2-D) and 4/9 Um (3-D); Re = Ū D / ν. The drag and lift coefficients of a force
    F (N, the x or y component on the cylinder) are c = 2 F / (ρ Ū² D) in 2-D (F per unit
    depth) and c = 2 F / (ρ Ū² D H) in 3-D: ``c = coefficient_scale * F``.

    Attributes:
      name: ``"2D-1"``, ``"2D-2"`` or ``"3D-1Z"``.
      geometry: the :class:`DFGGeometry`.
      um: Um, the largest inflow velocity (m/s).
      nu: kinematic viscosity ν (m²/s).
      reference: ``{quantity: (low, high)}`` the published bounds: ``c_D``, ``c_L``, ``dp``
        (Δp, Pa) for the steady cases, ``c_D_max``, ``c_L_max``, ``St`` (= D / (Ū T), T the
        lift's period) for 2D-2. For 3D-1Z, ``low == high``: the FeatFlow values of Bayraktar,
        Mierka & Turek (2012, Int. J. Comput. Sci. Eng. 7, 253–266), the finest published.
    """

    name: str
    geometry: DFGGeometry
    um: float
    nu: float
    reference: types.MappingProxyType = dataclasses.field(hash=False)  # the case hashes (a static jit argument)

    @property
    def mean_velocity(self) -> float:
        """Ū (m/s): 2/3 Um in 2-D, 4/9 Um in 3-D."""
        return (2 / 3 if self.geometry.dim == 2 else 4 / 9) * self.um

    @property
    def reynolds(self) -> float:
        """Re = Ū D / ν."""
        return self.mean_velocity * self.geometry.diameter / self.nu

    @property
    def coefficient_scale(self) -> float:
        """2 / (Ū² D) in 2-D, 2 / (Ū² D H) in 3-D (1/N, ρ = 1): c_D = scale · F_x, c_L = scale · F_y."""
        g = self.geometry
        return 2 / (self.mean_velocity**2 * g.diameter * (1.0 if g.dim == 2 else g.height))

    def inflow(self, y, z=None):
        """The inflow velocity U (m/s, along x) at ``y`` (2-D) or ``(y, z)`` (3-D): arrays of one shape."""
        H = self.geometry.height
        if self.geometry.dim == 2:
            return 4 * self.um * y * (H - y) / H**2
        if z is None:
            raise ValueError(f"inflow: case {self.name} is 3-D and needs z, got z=None")
        return 16 * self.um * y * z * (H - y) * (H - z) / H**4


def _case(name, geometry, um, **reference):
    return DFGCase(name, geometry, um, 1e-3, types.MappingProxyType(reference))


DFG_2D_1 = _case("2D-1", DFG_2D, 0.3, c_D=(5.57, 5.59), c_L=(0.0104, 0.0110), dp=(0.1172, 0.1176))
DFG_2D_2 = _case("2D-2", DFG_2D, 1.5, c_D_max=(3.22, 3.24), c_L_max=(0.99, 1.01), St=(0.295, 0.305))
DFG_3D_1Z = _case("3D-1Z", DFG_3D, 0.45, c_D=(6.18533, 6.18533), c_L=(0.009401, 0.009401))

# Half-width of the square that holds the O-grid ring (m): the ring spans 0.05 ≤ r ≤ 0.1·√2.
_SQUARE = 0.1
# Size ratio of consecutive elements: radially in the ring (outwards), downstream of the square.
RING_GROWTH = 1.3
WAKE_GROWTH = 1.15
# Level-0 divisions: per quarter of the cylinder, radially, upstream of the square, downstream,
# below it, above it, and (3-D) the layers in z.
_DIVISIONS = dict(quarter=4, radial=3, upstream_2d=2, upstream_3d=3, downstream=12, below=2, above=2, layers=4)


def dfg_2d(path: str | os.PathLike, level: int = 0, depth: float = 0.1) -> str:
    """Write the 2-D DFG mesh (one hex27 layer deep in z) as a Gmsh 4.1 ``.msh`` file.

    The channel [0, 2.2] × [0, 0.41] × [0, depth] (m) less the cylinder of centre (0.2, 0.2),
    radius 0.05: ``176 · 4**level`` hexahedra, one deep. Physical surface groups ``inlet``
    (x = 0), ``outlet`` (x = 2.2), ``walls`` (y = 0 and y = 0.41), ``cylinder``, ``front``
    (z = 0) and ``back`` (z = depth), each front face the translate of a back face by
    (0, 0, depth) node for node (pair them with :func:`jaxsem.mesh.make_periodic`); the
    physical volume ``fluid``. Returns the path written.

    Raises ``ImportError`` without the ``gmsh`` package and ``ValueError`` naming a bad
    ``level`` (an int in [0, 6]) or ``depth`` (> 0).
    """
    level = _check_level(level)
    if isinstance(depth, bool) or not isinstance(depth, (int, float)) or not np.isfinite(depth) or depth <= 0:
        raise ValueError(f"depth must be a positive number (m), got {depth!r}")
    return _write(path, DFG_2D, level, float(depth), [1])


def dfg_3d(path: str | os.PathLike, level: int = 0) -> str:
    """Write the 3-D DFG mesh (hex27) as a Gmsh 4.1 ``.msh`` file.

    The duct [0, 2.5] × [0, 0.41] × [0, 0.41] (m) less the cylinder of centre (0.5, 0.2),
    radius 0.05, axis along z: ``184 · 4**level`` hexahedra per layer, ``4 · 2**level``
    equal layers (``736 · 8**level`` in all). Physical surface groups ``inlet`` (x = 0),
    ``outlet`` (x = 2.5), ``walls`` (y = 0, y = 0.41, z = 0, z = 0.41), ``cylinder``; the
    physical volume ``fluid``. Returns the path written.

    Raises ``ImportError`` without the ``gmsh`` package and ``ValueError`` naming a bad ``level``.
    """
    level = _check_level(level)
    return _write(path, DFG_3D, level, DFG_3D.height, [_DIVISIONS["layers"] * 2**level])


def dfg_mesh(case: str, order: int, level: int = 0, path: str | os.PathLike | None = None) -> Mesh:
    """The DFG benchmark mesh as a :class:`Mesh` of polynomial order ``order``.

    ``case``: ``"2D"`` (:func:`dfg_2d`, depth 0.1, made periodic in z by
    :func:`jaxsem.mesh.make_periodic` of ``front`` and ``back``: boundary groups ``inlet``,
    ``outlet``, ``walls``, ``cylinder``) or ``"3D"`` (:func:`dfg_3d`). ``path``: where the
    ``.msh`` file is written (kept), or ``None`` for a temporary folder (removed). The 2-D
    mesh is 0.1 m deep: a force integrated over it is 0.1 times the force per unit depth that
    :attr:`DFGCase.coefficient_scale` takes.
    """
    if case not in ("2D", "3D"):
        raise ValueError(f"case must be '2D' or '3D', got {case!r}")
    with tempfile.TemporaryDirectory() as tmp:
        file = os.path.join(tmp, f"dfg{case.lower()}.msh") if path is None else path
        (dfg_2d if case == "2D" else dfg_3d)(file, level)
        mesh = read_gmsh(file, order)
    return make_periodic(mesh, "front", "back") if case == "2D" else mesh


def _check_level(level) -> int:
    if isinstance(level, bool) or not isinstance(level, (int, np.integer)) or not 0 <= level <= 6:
        raise ValueError(f"level must be an int in [0, 6] (each level doubles the divisions), got {level!r}")
    return int(level)


def _import_gmsh():
    try:
        import gmsh
    except ImportError as err:
        raise ImportError("the DFG meshes are built with the gmsh Python API: pip install 'jaxsem[gmsh]'") from err
    return gmsh


def _write(path, geometry: DFGGeometry, level: int, depth: float, layers: list) -> str:
    """Build the blocks in a fresh Gmsh model, extrude them by ``depth`` in ``layers``, mesh at
    second order and write ``path`` (the caller's Gmsh session, if any, is left as it was)."""
    gmsh = _import_gmsh()
    path = os.fspath(path)
    started = not gmsh.isInitialized()
    if started:
        gmsh.initialize(readConfigFiles=False, interruptible=False)
    previous = gmsh.model.getCurrent() if gmsh.model.list() else None
    saved = {key: gmsh.option.getNumber(key) for key in _OPTIONS}
    try:
        gmsh.model.add(f"dfg{geometry.dim}d")
        gmsh.option.setNumber("General.Terminal", 0)
        surfaces = _blocks(gmsh.model.geo, geometry, level)
        out = gmsh.model.geo.extrude([(2, s) for s in surfaces], 0, 0, depth, numElements=layers, recombine=True)
        gmsh.model.geo.synchronize()
        volumes = [t for d, t in out if d == 3]
        groups = _classify(gmsh.model, geometry, volumes, depth)
        for name, tags in groups.items():
            gmsh.model.addPhysicalGroup(2, tags, name=name)
        gmsh.model.addPhysicalGroup(3, volumes, name="fluid")
        gmsh.option.setNumber("Mesh.ElementOrder", 2)
        gmsh.option.setNumber("Mesh.SecondOrderIncomplete", 0)  # hex27, not hex20
        gmsh.option.setNumber("Mesh.MshFileVersion", 4.1)
        gmsh.option.setNumber("Mesh.Binary", 0)
        gmsh.model.mesh.generate(3)
        gmsh.write(path)
    finally:
        gmsh.model.remove()
        for key, value in saved.items():
            gmsh.option.setNumber(key, value)
        if previous is not None:
            gmsh.model.setCurrent(previous)
        if started:
            gmsh.finalize()
    return path


# The Gmsh options _write sets, restored after it for a caller's own Gmsh session.
_OPTIONS = ("General.Terminal", "Mesh.ElementOrder", "Mesh.SecondOrderIncomplete", "Mesh.MshFileVersion",
            "Mesh.Binary")


def _blocks(geo, g: DFGGeometry, level: int) -> list:
    """The 12 transfinite, recombined blocks of the plane z = 0: eight around the square
    [cx ± a] × [cy ± a], four in the O-grid ring between it and the cylinder. Returns their tags."""
    cx, cy, R, a = g.centre[0], g.centre[1], g.radius, _SQUARE
    X = (0.0, cx - a, cx + a, g.length)
    Y = (0.0, cy - a, cy + a, g.height)
    k = 2**level
    up = _DIVISIONS["upstream_2d" if g.dim == 2 else "upstream_3d"]
    nx = (up * k, _DIVISIONS["quarter"] * k, _DIVISIONS["downstream"] * k)
    ny = (_DIVISIONS["below"] * k, _DIVISIONS["quarter"] * k, _DIVISIONS["above"] * k)
    # Keep the graded spacing one geometry: at level L the ratio is growth**(1/2**L).
    gx = (1.0, 1.0, WAKE_GROWTH ** (1 / k))
    nr, gr = _DIVISIONS["radial"] * k, RING_GROWTH ** (1 / k)

    P = [[geo.addPoint(x, y, 0.0) for y in Y] for x in X]  # P[i][j] at (X[i], Y[j])
    centre = geo.addPoint(cx, cy, 0.0)
    s = R / np.sqrt(2.0)
    # circle points at 45°, 135°, 225°, 315° paired with the square corners of those diagonals
    corners = [(2, 2), (1, 2), (1, 1), (2, 1)]
    C = [geo.addPoint(cx + s * dx, cy + s * dy, 0.0) for dx, dy in ((1, 1), (-1, 1), (-1, -1), (1, -1))]

    def line(p, q, n, growth=1.0):
        tag = geo.addLine(p, q)
        geo.mesh.setTransfiniteCurve(tag, n + 1, "Progression", growth)
        return tag

    # horizontal lines h[i][j]: P[i][j] → P[i+1][j]; vertical lines v[i][j]: P[i][j] → P[i][j+1]
    h = [[line(P[i][j], P[i + 1][j], nx[i], gx[i]) for j in range(4)] for i in range(3)]
    v = [[line(P[i][j], P[i][j + 1], ny[j]) for j in range(3)] for i in range(4)]
    radial = [line(C[q], P[i][j], nr, gr) for q, (i, j) in enumerate(corners)]
    arcs = []
    for q in range(4):  # arc q from C[q] counter-clockwise to C[q + 1]
        tag = geo.addCircleArc(C[q], centre, C[(q + 1) % 4])
        geo.mesh.setTransfiniteCurve(tag, nx[1] + 1)
        arcs.append(tag)

    def surface(loop):
        tag = geo.addPlaneSurface([geo.addCurveLoop(loop)])
        geo.mesh.setTransfiniteSurface(tag)
        geo.mesh.setRecombine(2, tag)
        return tag

    out = []
    for i in range(3):
        for j in range(3):
            if (i, j) != (1, 1):  # counter-clockwise: bottom, right, −top, −left
                out.append(surface([h[i][j], v[i + 1][j], -h[i][j + 1], -v[i][j]]))
    # ring blocks, counter-clockwise, each between arc q and the square side facing it
    side = [-h[1][2], -v[1][1], h[1][1], v[2][1]]  # the square's top (leftwards), left (down), bottom, right
    for q in range(4):
        out.append(surface([radial[q], side[q], -radial[(q + 1) % 4], -arcs[q]]))
    return out


def _classify(model, g: DFGGeometry, volumes: list, depth: float) -> dict:
    """Names of the extruded blocks' boundary surfaces, from their bounding boxes:
    ``{name: [surface tags]}``."""
    tol = 1e-9 * g.length
    groups = {name: [] for name in ("inlet", "outlet", "walls", "cylinder")}
    if g.dim == 2:
        groups.update(front=[], back=[])
    for _, tag in model.getBoundary([(3, v) for v in volumes], combined=True, oriented=False):
        lo, hi = np.array(model.getBoundingBox(2, tag)).reshape(2, 3)
        flat = np.abs(hi - lo) < tol  # the axis a plane surface is normal to
        sides = {0: ("inlet", "outlet"), 1: ("walls", "walls"),
                 2: ("front", "back") if g.dim == 2 else ("walls", "walls")}
        ends = {0: g.length, 1: g.height, 2: depth}
        name = None
        for axis in np.nonzero(flat)[0].tolist():
            if abs(lo[axis]) < tol or abs(lo[axis] - ends[axis]) < tol:
                name = sides[axis][int(abs(lo[axis]) >= tol)]
        if not flat.any():
            name = "cylinder"
        if name is None:
            raise RuntimeError(f"DFG mesh: boundary surface {tag} (box {lo.tolist()}–{hi.tolist()}) is no side")
        groups[name].append(tag)
    return groups
