"""Procedural tracks, a chase-camera renderer and a kinematic car for the Udacity emulator.

World: metres, ground plane z = 0, x east, y north, heading in radians counter-clockwise
from +x. The car drives a track counter-clockwise; a name with the suffix ``-cw``
(``lakeside-cw``, ``random-900001-cw``) is the same loop mirrored (y -> -y) and driven
clockwise, so each of its left curves is a right curve of the same radius. Steering follows
the simulator's convention: normalised -1..1, positive = turn right, +-1 = +-25 degrees of
wheel angle.

A track's centre line is a polar curve r(theta) = R (1 + sum_k a_k sin(k theta + p_k))
with r > 0, so it is always a simple closed loop; its harmonics give left and right
curves. Its points run in the direction of travel, so what is read from them (tangents,
normals to the left, signed curvature, the cte's sign, progress, pure pursuit) holds either
way round. The road (edges, dashed centre line) and the grass are painted once into a
top-down texture (0.1 m/px; a clockwise track's is its twin's, mirrored); each frame is
then one ``cv2.warpPerspective`` of that texture by the ground-plane homography of the
camera, plus sky, distance haze and the car's silhouette: about a millisecond per 320x160
frame.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

import numpy as np

from nac_drive.simulators.centre_line import segments

MAX_STEER_DEG = 25.0
MPH_PER_MPS = 2.2369363
CW_SUFFIX = "-cw"  # a track's name with it: the same loop mirrored, driven clockwise


@dataclass(frozen=True)
class TrackSpec:
    """Recipe of a procedural track."""

    name: str
    seed: int
    radius: float = 90.0  # mean radius R of the loop (m)
    amplitude: float = 0.25  # total relative amplitude of the radius harmonics
    harmonics: tuple[int, ...] = (2, 3, 4)
    road_width: float = 8.0  # m, edge line to edge line
    min_turn_radius: float = 18.0  # amplitudes are scaled down until every curve is at least this wide
    clockwise: bool = False  # the loop mirrored (y -> -y): driven clockwise, its left curves right ones


TRACKS: dict[str, TrackSpec] = {
    "gentle": TrackSpec("gentle", seed=1, radius=80.0, amplitude=0.12, harmonics=(2, 3)),
    "lakeside": TrackSpec("lakeside", seed=2, radius=90.0, amplitude=0.28, harmonics=(2, 3, 4)),
    "serpentine": TrackSpec("serpentine", seed=3, radius=100.0, amplitude=0.30, harmonics=(3, 4, 5)),
    "canyon": TrackSpec("canyon", seed=4, radius=85.0, amplitude=0.32, harmonics=(2, 4, 5), road_width=7.0),
}


def track_spec(name: str) -> TrackSpec:
    """A named track (see ``TRACKS``) or ``random-<seed>`` for a fresh one, counter-clockwise;
    either with the suffix ``-cw`` (:data:`CW_SUFFIX`): its mirror image, driven clockwise."""
    base = name.removesuffix(CW_SUFFIX)
    if base in TRACKS:
        spec = TRACKS[base]
    elif base.startswith("random-") and base[7:].isdigit():
        seed = int(base[7:])
        rng = np.random.default_rng(seed)
        spec = TrackSpec(base, seed=seed, radius=float(rng.uniform(75, 110)),
                         amplitude=float(rng.uniform(0.15, 0.32)), harmonics=(2, 3, 4, 5))
    else:
        raise ValueError(f"unknown track {name!r}: choose one of {sorted(TRACKS)} or random-<seed>, "
                         f"each optionally with {CW_SUFFIX} (driven clockwise)")
    return replace(spec, name=name, clockwise=True) if base != name else spec


class Track:
    """A closed centre line sampled every ~0.5 m, with tangents, curvature and a painted texture.

    Every attribute runs in the direction of travel (clockwise on a ``spec.clockwise`` track):
    points [N, 2], tangents [N, 2] (unit), normals [N, 2] (unit, to the left), curvature [N]
    (1/m, positive = left curve), s [N] (arc length), length (m), and the
    segments from point i to point i + 1 (:func:`~nac_drive.simulators.centre_line.segments`):
    segment_headings [N] (radians), segment_lengths [N] (m).
    """

    def __init__(self, spec: TrackSpec, spacing: float = 0.5):
        self.spec = spec
        self.half_width = spec.road_width / 2
        self._mirror = -1.0 if spec.clockwise else 1.0  # y's factor: -1 mirrors the loop (theta runs clockwise)
        rng = np.random.default_rng(spec.seed)
        weights = rng.uniform(0.5, 1.0, len(spec.harmonics))
        phases = rng.uniform(0, 2 * math.pi, len(spec.harmonics))
        theta = np.linspace(0, 2 * math.pi, 4096, endpoint=False)
        scale = 1.0
        for _ in range(40):
            amps = spec.amplitude * scale * weights / weights.sum()
            r = spec.radius * (1 + sum(a * np.sin(k * theta + p) for a, k, p in zip(amps, spec.harmonics, phases)))
            pts = np.stack([r * np.cos(theta), self._mirror * r * np.sin(theta)], axis=1)
            self._set_points(pts, spacing)
            if np.abs(self.curvature).max() <= 1.0 / spec.min_turn_radius:
                break
            scale *= 0.9
        self._texture = None

    def _set_points(self, pts: np.ndarray, spacing: float) -> None:
        seg = np.linalg.norm(np.roll(pts, -1, axis=0) - pts, axis=1)
        s = np.concatenate([[0.0], np.cumsum(seg)])
        self.length = float(s[-1])
        n = int(self.length / spacing)
        s_new = np.linspace(0, self.length, n, endpoint=False)
        closed = np.vstack([pts, pts[:1]])
        self.points = np.stack([np.interp(s_new, s, closed[:, 0]), np.interp(s_new, s, closed[:, 1])], axis=1)
        self.s = s_new
        d = (np.roll(self.points, -1, axis=0) - np.roll(self.points, 1, axis=0))
        self.tangents = d / np.linalg.norm(d, axis=1, keepdims=True)
        self.normals = np.stack([-self.tangents[:, 1], self.tangents[:, 0]], axis=1)
        heading = np.unwrap(np.arctan2(self.tangents[:, 1], self.tangents[:, 0]))
        lap = 2 * math.pi * round((heading[-1] - heading[0]) / (2 * math.pi))  # the turn of a lap: +-2 pi
        dh = np.gradient(np.concatenate([heading[-2:] - lap, heading, heading[:2] + lap]))[2:-2]
        self.curvature = dh / (self.length / n)
        self.segment_headings, self.segment_lengths = segments(self.points)

    # ---- geometry -------------------------------------------------------------------
    def pose_at(self, s: float) -> tuple[float, float, float]:
        """(x, y, heading) on the centre line at arc length s."""
        i = int(round(s / self.length * len(self.points))) % len(self.points)
        tx, ty = self.tangents[i]
        return float(self.points[i, 0]), float(self.points[i, 1]), math.atan2(ty, tx)

    def nearest(self, x: float, y: float, hint: int | None = None, search: int = 80) -> int:
        """Index of the centre-line point nearest (x, y); local search around ``hint``."""
        if hint is None:
            idx = np.arange(len(self.points))
        else:
            idx = np.arange(hint - search, hint + search + 1) % len(self.points)
        d2 = ((self.points[idx] - (x, y)) ** 2).sum(axis=1)
        return int(idx[int(np.argmin(d2))])

    def cross_track(self, x: float, y: float, i: int) -> float:
        """Signed distance (m) from the centre line at point i: positive = right of it."""
        return float(-np.dot((x, y) - self.points[i], self.normals[i]))

    # ---- painting -------------------------------------------------------------------
    RES = 0.1  # m per texture pixel
    GRASS = (40, 110, 60)  # BGR
    ASPHALT = (92, 88, 86)
    WHITE = (235, 235, 235)
    YELLOW = (40, 190, 225)

    def texture(self):
        """(BGR uint8 texture [H, W, 3], 3x3 matrix texture pixel -> world metres)."""
        if self._texture is None:
            self._texture = self._paint()
        return self._texture

    def _paint(self):
        import cv2

        rng = np.random.default_rng(self.spec.seed + 1000)
        # paint the counter-clockwise twin and mirror the texture's map to the world: grass and
        # all, a clockwise track's frames are then its twin's flipped left-right
        twin = np.array([1.0, self._mirror])
        centre, n = self.points * twin, self.normals * twin
        margin = 60.0
        lo = centre.min(axis=0) - margin
        hi = centre.max(axis=0) + margin
        w, h = (np.ceil((hi - lo) / self.RES)).astype(int)
        # grass: base colour with blotches (low-frequency noise) and fine grain
        blotch = cv2.resize(rng.normal(0, 1, (h // 64 + 2, w // 64 + 2)).astype(np.float32), (w, h),
                            interpolation=cv2.INTER_CUBIC)
        grain = cv2.resize(rng.normal(0, 1, (h // 4 + 2, w // 4 + 2)).astype(np.float32), (w, h),
                           interpolation=cv2.INTER_LINEAR)
        shade = (1.0 + 0.12 * blotch + 0.06 * grain)[..., None]
        tex = np.clip(np.array(self.GRASS, np.float32) * shade, 0, 255).astype(np.uint8)

        shift = 4  # sub-pixel precision of the drawing calls

        def px(points):
            return np.round((points - lo) / self.RES * (1 << shift)).astype(np.int32).reshape(-1, 1, 2)

        def line(points, color, width_m, closed=True):
            cv2.polylines(tex, [px(points)], closed, color, max(1, int(round(width_m / self.RES))),
                          lineType=cv2.LINE_AA, shift=shift)

        hw = self.half_width
        line(centre, self.ASPHALT, 2 * hw + 1.0)  # road + 0.5 m shoulder each side
        line(centre + n * (hw + 0.5), (70, 120, 150), 0.8)  # dirt verge
        line(centre - n * (hw + 0.5), (70, 120, 150), 0.8)
        line(centre + n * (hw - 0.15), self.WHITE, 0.25)  # edge lines
        line(centre - n * (hw - 0.15), self.WHITE, 0.25)
        dash, gap = 3.0, 6.0  # dashed centre line
        phase = np.mod(self.s, dash + gap) < dash
        starts = np.flatnonzero(phase & ~np.roll(phase, 1))
        for a in starts:
            k = a
            seg = []
            while phase[k % len(phase)] and len(seg) < 20:
                seg.append(centre[k % len(phase)])
                k += 1
            if len(seg) >= 2:
                line(np.array(seg), self.YELLOW, 0.15, closed=False)
        to_twin = np.array([[self.RES, 0, lo[0]], [0, self.RES, lo[1]], [0, 0, 1]], dtype=np.float64)
        to_world = np.diag([1.0, self._mirror, 1.0]) @ to_twin
        return np.ascontiguousarray(tex), to_world


@dataclass
class CameraModel:
    """Pinhole camera pitched down; ``back``/``height`` place it behind/above the car centre."""

    width: int = 320
    height: int = 160
    focal: float = 150.0  # px (horizontal field of view ~94 degrees, like the simulator's wide view)
    pitch_deg: float = 10.0
    cam_height: float = 3.2  # m
    back: float = 7.0  # m behind the car's centre (chase camera)
    haze_distance: float = 140.0  # m; distance haze blends the far road into the sky

    def __post_init__(self):
        self.cx, self.cy = self.width / 2, self.height / 2
        self.K = np.array([[self.focal, 0, self.cx], [0, self.focal, self.cy], [0, 0, 1]], dtype=np.float64)
        pitch = math.radians(self.pitch_deg)
        self.horizon = self.cy - self.focal * math.tan(pitch)
        rows = np.arange(self.height, dtype=np.float64)
        below = pitch + np.arctan((rows - self.cy) / self.focal)  # ray angle below horizontal
        dist = np.where(below > 1e-3, self.cam_height / np.tan(np.maximum(below, 1e-3)), np.inf)
        self.haze = (1 - np.exp(-dist / self.haze_distance)).astype(np.float32)[:, None, None]
        sky_top, sky_low = np.array((200, 140, 90), np.float32), np.array((235, 215, 200), np.float32)  # BGR
        a = np.clip(rows / max(self.horizon, 1), 0, 1)[:, None]
        sky = (sky_top * (1 - a) + sky_low * a)
        self.sky = np.repeat(sky[:, None, :], self.width, axis=1).astype(np.float32)

    def rotation(self, heading: float) -> np.ndarray:
        """World -> camera rotation (camera axes: x right, y down, z forward)."""
        p = math.radians(self.pitch_deg)
        f = np.array([math.cos(heading) * math.cos(p), math.sin(heading) * math.cos(p), -math.sin(p)])
        r = np.array([math.sin(heading), -math.cos(heading), 0.0])
        d = np.cross(f, r)
        return np.stack([r, d, f])


class Renderer:
    """Renders BGR frames [160, 320, 3] of a track from a camera attached to the car."""

    def __init__(self, track: Track, camera: CameraModel | None = None, car_color=(40, 40, 190)):
        self.track = track
        self.camera = camera or CameraModel()
        self.car_color = np.array(car_color, np.float32)

    def render(self, x: float, y: float, heading: float, lateral: float = 0.0, draw_car: bool = True) -> np.ndarray:
        """BGR uint8 [H, W, 3] seen from the chase camera of a car at (x, y, heading),
        moved ``lateral`` metres to the right (the side cameras)."""
        import cv2

        cam = self.camera
        tex, to_world = self.track.texture()
        fwd = np.array([math.cos(heading), math.sin(heading)])
        right = np.array([math.sin(heading), -math.cos(heading)])
        c_xy = np.array([x, y]) - cam.back * fwd + lateral * right
        C = np.array([c_xy[0], c_xy[1], cam.cam_height])
        R = cam.rotation(heading)
        H = cam.K @ np.column_stack([R[:, 0], R[:, 1], -R @ C]) @ to_world
        ground = cv2.warpPerspective(tex, H, (cam.width, cam.height), flags=cv2.INTER_LINEAR,
                                     borderMode=cv2.BORDER_CONSTANT, borderValue=Track.GRASS)
        img = ground.astype(np.float32) * (1 - cam.haze) + cam.sky * cam.haze
        top = int(math.ceil(cam.horizon)) + 1
        img[:top] = cam.sky[:top]
        if draw_car:
            self._draw_car(img, x, y, heading, C, R)
        return img.astype(np.uint8)

    def _draw_car(self, img, x, y, heading, C, R, length=4.4, width=1.9, height=1.4):
        import cv2

        fwd = np.array([math.cos(heading), math.sin(heading), 0])
        right = np.array([math.sin(heading), -math.cos(heading), 0])
        up = np.array([0, 0, 1.0])
        base = np.array([x, y, 0.0])

        def project(corners):
            pc = (corners - C) @ R.T
            uv = pc[:, :2] / pc[:, 2:3] * self.camera.focal + (self.camera.cx, self.camera.cy)
            return np.round(uv * 16).astype(np.int32)

        body = [base + a * fwd * length / 2 + b * right * width / 2 + z * up
                for a in (-1, 1) for b in (-1, 1) for z in (0.25, height * 0.6)]
        roof = [base + a * fwd * length / 4 - fwd * 0.3 + b * right * width * 0.4 + up * height
                for a in (-1, 1) for b in (-1, 1)]
        for pts, color in ((body, self.car_color), (roof + body[1::2], self.car_color * 0.7)):
            hull = cv2.convexHull(project(np.array(pts)))
            cv2.fillConvexPoly(img, hull, color.tolist(), lineType=cv2.LINE_AA, shift=4)


@dataclass
class Car:
    """Kinematic bicycle model. ``steer`` -1..1 (positive right), ``throttle`` -1..1 (negative brakes)."""

    x: float = 0.0
    y: float = 0.0
    heading: float = 0.0
    speed: float = 0.0  # m/s
    steer: float = 0.0
    throttle: float = 0.0
    wheelbase: float = 2.7
    max_accel: float = 3.5  # m/s^2 at full throttle from standstill
    max_brake: float = 8.0  # m/s^2 at throttle -1
    top_speed: float = 30.0 / MPH_PER_MPS  # the simulator's limit, 30 mph

    def step(self, steer: float, throttle: float, dt: float) -> None:
        self.steer = float(np.clip(steer, -1, 1))
        self.throttle = float(np.clip(throttle, -1, 1))
        if self.throttle >= 0:
            accel = self.throttle * self.max_accel * (1 - self.speed / self.top_speed)
        else:
            accel = self.throttle * self.max_brake
        accel -= 0.05 * self.speed  # rolling resistance
        self.speed = max(0.0, self.speed + accel * dt)
        delta = math.radians(self.steer * MAX_STEER_DEG)
        self.heading -= self.speed / self.wheelbase * math.tan(delta) * dt  # right = clockwise
        self.x += self.speed * math.cos(self.heading) * dt
        self.y += self.speed * math.sin(self.heading) * dt

    @property
    def speed_mph(self) -> float:
        return self.speed * MPH_PER_MPS


@dataclass
class Progress:
    """Follows a car along a track: cross-track error, distance, laps, off-road events."""

    track: Track
    index: int = 0
    travelled: float = 0.0  # m along the centre line (negative if driving backwards)
    off_road: bool = False
    off_road_events: int = 0
    cte: float = 0.0
    along: float = 0.0  # m ahead of the nearest centre-line point (``travelled`` moves in its ~0.5 m steps)
    abs_cte: list[float] = field(default_factory=list)

    def update(self, x: float, y: float) -> None:
        n = len(self.track.points)
        i = self.track.nearest(x, y, hint=self.index)
        step = (i - self.index + n // 2) % n - n // 2
        self.travelled += step * self.track.length / n
        self.index = i
        self.cte = self.track.cross_track(x, y, i)
        self.along = float(np.dot((x, y) - self.track.points[i], self.track.tangents[i]))
        self.abs_cte.append(abs(self.cte))
        off = abs(self.cte) > self.track.half_width
        if off and not self.off_road:
            self.off_road_events += 1
        self.off_road = off

    @property
    def laps(self) -> int:
        return max(0, int(self.travelled // self.track.length))

    def summary(self) -> dict:
        cte = np.array(self.abs_cte) if self.abs_cte else np.zeros(1)
        return {
            "laps": self.laps,
            "distance_m": round(self.travelled, 2),
            "lap_fraction": round(self.travelled / self.track.length, 4),
            "mean_abs_cte_m": round(float(cte.mean()), 4),
            "max_abs_cte_m": round(float(cte.max()), 4),
            "off_road_events": self.off_road_events,
        }


def pure_pursuit(track: Track, car: Car, index: int, lookahead: float = 6.0, offset: float = 0.0) -> float:
    """Normalised steering (-1..1, positive right) that steers ``car`` toward the point
    ``lookahead`` m ahead on the centre line, shifted ``offset`` m to the right."""
    n = len(track.points)
    j = (index + int(round(lookahead / track.length * n))) % n
    target = track.points[j] - offset * track.normals[j]
    dx, dy = target[0] - car.x, target[1] - car.y
    alpha = math.atan2(dy, dx) - car.heading  # positive = target to the left
    alpha = (alpha + math.pi) % (2 * math.pi) - math.pi
    delta = math.atan2(2 * car.wheelbase * math.sin(alpha), max(math.hypot(dx, dy), 1e-3))
    return float(np.clip(-math.degrees(delta) / MAX_STEER_DEG, -1, 1))
