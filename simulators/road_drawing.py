"""CarRacing drawn ~3x faster, pixel for pixel the same.

CarRacing-v3 draws every frame on a 1000x800 canvas: a background, 400 grass patches and
the track's 300-450 road tiles and kerbs. For each of those quadrilaterals its
``_render_road`` rotates, scales and bounds-checks the corners in Python
(``pygame.math.Vector2`` one point at a time), though only ~60 of them are on screen once
the view has zoomed in (after the first second of an episode); that bookkeeping is most of
the cost of a step. :func:`draw_faster` replaces it on one env with the same
arithmetic on all corners at once in numpy, then draws the visible polygons with the same
pygame calls and the same float coordinates, so every observation is identical to the
stock env's (tested against an unmodified env, including track changes and visited tiles).
It also makes the env's ``_render`` load the font of the score once (:class:`FontLoadedOnce`):
the stock method loads it from its file at every frame, and a font loaded and drawing its
first text takes ~0.85 ms, one that has drawn before ~0.02 ms (of a ~6.5 ms step).

Each is applied only where gymnasium's drawing code is the code this replicates (compared
by a hash of its source) and pygame rotates points as replicated here (checked on random
points); anywhere else CarRacing draws as it always did.
"""

from __future__ import annotations

import hashlib
import inspect
import math
import sys
import threading
from functools import lru_cache

import gymnasium as gym
import numpy as np

# sha256 of the source of CarRacing._render_road + CarRacing._draw_colored_polygon that
# the function below replicates (gymnasium 1.x).
REPLICATED_SOURCE_SHA256 = "488262bbdbbe17655f6c50900df8ce544c0043584c48c4263588969ad4f9ca8b"
# sha256 of the source of CarRacing._render whose fonts FontLoadedOnce serves (gymnasium 1.x): it
# builds each frame's score font anew and only draws text with it.
RENDER_SOURCE_SHA256 = "55de32c78669c2be249b6e4edba992c0c332a0f43c4cbe2f7255fa8dd06a3924"
TWO_PI, HALF_PI = 2 * math.pi, math.pi / 2
VECTOR_EPSILON = 1e-6   # pygame.math.Vector2().epsilon
_FONT_SWAP = threading.Lock()   # held while pygame.font.Font is FontLoadedOnce's stand-in


def rotation(angle: float) -> tuple[float, float] | None:
    """``(cos, sin)`` as ``pygame.math.Vector2.rotate_rad(angle)`` computes them (the angle
    first brought into [0, 2 pi)); ``None`` within its epsilon of a quarter turn, where
    pygame swaps coordinates instead, and for an angle that is not finite."""
    if not math.isfinite(angle):
        return None
    angle = math.fmod(angle, TWO_PI)
    if angle < 0:
        angle += TWO_PI
    if math.fmod(angle + VECTOR_EPSILON, HALF_PI) < 2 * VECTOR_EPSILON:
        return None
    return math.cos(angle), math.sin(angle)


@lru_cache(maxsize=1)
def stock_drawing_is_replicated() -> bool:
    """True if the installed gymnasium and pygame draw the road as :class:`VectorisedRoad` does."""
    import pygame
    from gymnasium.envs.box2d.car_racing import CarRacing

    if _source_sha256(CarRacing._render_road, CarRacing._draw_colored_polygon) != REPLICATED_SOURCE_SHA256:
        return False   # another gymnasium, or no source shipped: keep the stock drawing
    if pygame.math.Vector2().epsilon != VECTOR_EPSILON:
        return False
    points = np.random.default_rng(0).uniform(-400, 400, (256, 3))   # x, y, angle
    for x, y, angle in points.tolist():
        turn = rotation(angle)
        if turn is not None:   # quarter turns are left to pygame
            cos, sin = turn
            if tuple(pygame.math.Vector2(x, y).rotate_rad(angle)) != (x * cos - y * sin, x * sin + y * cos):
                return False
    return True


def grass_patches() -> np.ndarray:
    """The grass patches CarRacing draws, ``float64 [400, 4, 2]`` in world coordinates."""
    from gymnasium.envs.box2d.car_racing import GRASS_DIM as g

    return np.array([[(g * x + g, g * y), (g * x, g * y), (g * x, g * y + g), (g * x + g, g * y + g)]
                     for x in range(-20, 20, 2) for y in range(-20, 20, 2)], dtype=np.float64)


def draw_faster(env: gym.Env) -> gym.Env:
    """Make ``env``'s CarRacing draw its road with :class:`VectorisedRoad` and its score with
    :class:`FontLoadedOnce`; returns ``env``.

    The env and its spec are unchanged otherwise (an env rebuilt from ``env.spec`` draws
    the stock way, with the same pixels). Each is left out if gymnasium's drawing code is
    not the replicated one, or if ``env`` is not a CarRacing that draws with it."""
    from gymnasium.envs.box2d.car_racing import CarRacing

    base = env.unwrapped
    stock = type(base)
    if not isinstance(base, CarRacing):
        return env
    if (stock._render_road is CarRacing._render_road and stock._draw_colored_polygon is CarRacing._draw_colored_polygon
            and stock_drawing_is_replicated()):
        base._render_road = VectorisedRoad(base)   # an instance attribute shadows the method
    if (stock._render is CarRacing._render and _source_sha256(CarRacing._render) == RENDER_SOURCE_SHA256
            and getattr(sys.modules.get("pygame"), "IS_CE", False)):   # pygame-ce refuses a font its quit freed
        base._render = FontLoadedOnce(base)
    return env


def _source_sha256(*functions) -> str | None:
    """sha256 of the ``functions``' sources one after another, None where no source ships."""
    try:
        return hashlib.sha256("".join(inspect.getsource(f) for f in functions).encode()).hexdigest()
    except (OSError, TypeError):
        return None


class FontLoadedOnce:
    """``CarRacing._render`` for one env, with each font it builds loaded once: for the
    length of the stock method's call, ``pygame.font.Font(name, size)`` answers with this
    env's font of that name and size, made at its first frame (made again if pygame's font
    module was shut down since, as another env's ``close`` does in human mode). The stock
    method only draws text with it, so the frames are the stock ones. One such call runs at a
    time in a process (a lock), so that envs drawn from several threads never see each other's
    stand-in for ``Font``."""

    def __init__(self, env):
        self.env = env
        self.fonts: dict[tuple, object] = {}
        self.stock_font = None   # pygame.font.Font, while a call stands in for it

    def __call__(self, mode: str):
        import pygame

        with _FONT_SWAP:
            self.stock_font, pygame.font.Font = pygame.font.Font, self.loaded_once
            try:
                return type(self.env)._render(self.env, mode)
            finally:
                pygame.font.Font = self.stock_font

    def loaded_once(self, name, size):
        """The stand-in for ``pygame.font.Font(name, size)``: this env's font of that name and size."""
        import pygame

        font = self.fonts.get((name, size))
        if font is not None:
            try:
                font.get_height()
                return font
            except pygame.error:   # made before pygame's font module was shut down
                pass
        font = self.fonts[(name, size)] = self.stock_font(name, size)
        return font


class VectorisedRoad:
    """``CarRacing._render_road`` for one env, with the corner arithmetic batched.

    The polygons' world coordinates are gathered once per track: ``float64 [P, 4, 2]``,
    the grass patches first, then the road tiles in drawing order. A new track is told by a
    new ``road_poly`` list (CarRacing builds one at each reset and never edits its corners).
    Colours are read at each frame (a visited tile's colour changes in place; domain
    randomisation changes the grass colour at reset)."""

    def __init__(self, env):
        self.env = env
        self.grass = grass_patches()
        self.road = None        # the env's road_poly list these corners were read from
        self.corners = self.grass

    def __call__(self, zoom: float, translation, angle: float) -> None:
        from gymnasium.envs.box2d.car_racing import MAX_SHAPE_DIM, PLAYFIELD, WINDOW_H, WINDOW_W
        from pygame import gfxdraw   # Box2D and pygame load with the env, not with this module

        env, road = self.env, self.env.road_poly
        if road is not self.road:   # a new track
            tiles = np.array([poly for poly, _ in road], dtype=np.float64).reshape(-1, 4, 2)
            self.road, self.corners = road, np.concatenate([self.grass, tiles])

        turn = rotation(angle)
        if turn is None:   # pygame's exact quarter turns: draw the stock way
            type(env)._render_road(env, zoom, translation, angle)
            return
        b = PLAYFIELD   # the background is never clipped
        env._draw_colored_polygon(env.surf, [(b, b), (b, -b), (-b, -b), (-b, b)], env.bg_color,
                                  zoom, translation, angle, clip=False)

        # Vector2.rotate_rad, then scale and shift, as the stock code does per corner.
        cos, sin = turn
        x, y = self.corners[..., 0], self.corners[..., 1]
        screen = np.stack([(x * cos - y * sin) * zoom + translation[0],
                           (x * sin + y * cos) * zoom + translation[1]], axis=-1)   # [P, 4, 2]
        # A polygon is drawn if any corner lies within the screen grown by MAX_SHAPE_DIM.
        near = ((screen >= -MAX_SHAPE_DIM) & (screen <= (WINDOW_W + MAX_SHAPE_DIM, WINDOW_H + MAX_SHAPE_DIM)))
        n_grass = len(self.grass)
        for i in np.flatnonzero(near.all(axis=-1).any(axis=-1)):
            color = env.grass_color if i < n_grass else [int(c) for c in road[i - n_grass][1]]
            polygon = screen[i].tolist()
            gfxdraw.aapolygon(env.surf, polygon, color)
            gfxdraw.filled_polygon(env.surf, polygon, color)
