"""CarRacing's road drawn vectorised and its score's font loaded once give the stock env's pixels, frame for frame."""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import pygame
import pytest
from gymnasium.envs.box2d.car_racing import SCALE, WINDOW_H, WINDOW_W, ZOOM

from nac_drive.simulators.carracing import GAS, LEFT, NOOP, RIGHT, make_carracing
from nac_drive.simulators.road_drawing import FontLoadedOnce, VectorisedRoad, rotation, stock_drawing_is_replicated


def test_make_carracing_draws_the_road_vectorised():
    """The installed gymnasium and pygame are the ones replicated, so every env the package
    makes gets the faster drawing (otherwise the tests below would compare stock to stock)."""
    assert stock_drawing_is_replicated()
    env = make_carracing()
    try:
        assert isinstance(env.unwrapped._render_road, VectorisedRoad)
        assert isinstance(env.unwrapped._render, FontLoadedOnce)
        assert env.spec.id == "CarRacing-v3" and not env.spec.additional_wrappers
    finally:
        env.close()


@pytest.mark.parametrize("domain_randomize", [False, True])
def test_frames_match_an_unmodified_env_across_tracks(domain_randomize):
    """Two tracks in a row on one env (the corners are re-read at a new track), driven with
    GAS so that tiles are visited (their colour changes) and with turns."""
    fast = make_carracing(domain_randomize=domain_randomize)
    stock = gym.make("CarRacing-v3", continuous=False, domain_randomize=domain_randomize)
    actions = np.random.default_rng(0).choice([NOOP, LEFT, RIGHT, GAS, GAS, GAS], 120)
    try:
        for seed in (11, None):   # None: the next track of the same generator
            first, stock_first = fast.reset(seed=seed)[0], stock.reset(seed=seed)[0]
            np.testing.assert_array_equal(first, stock_first)
            for action in actions:
                obs, reward, *_ = fast.step(int(action))
                stock_obs, stock_reward, *_ = stock.step(int(action))
                np.testing.assert_array_equal(obs, stock_obs)
                assert reward == stock_reward
            assert fast.unwrapped.tile_visited_count > 0   # tiles changed colour on the way
    finally:
        fast.close()
        stock.close()


QUARTER = math.pi / 2


@pytest.mark.parametrize("angle", [0.0, QUARTER, -QUARTER, math.pi, 2 * math.pi, QUARTER + 5e-7, math.pi - 5e-7,
                                   QUARTER + 2e-6, -math.pi + 2e-6, 0.3, -2.9, 40.0])
def test_one_frame_of_road_matches_the_stock_method_at_any_angle(angle):
    """Quarter turns take pygame's exact path (:func:`rotation` gives None there); other
    angles the batched one. Both draw what ``CarRacing._render_road`` draws."""
    env = make_carracing(seed=5)
    try:
        base = env.unwrapped
        zoom = ZOOM * SCALE   # the view CarRacing draws, centred on the car
        shift = pygame.math.Vector2(*(-zoom * c for c in base.car.hull.position)).rotate_rad(angle)
        translation = (WINDOW_W / 2 + shift[0], WINDOW_H / 4 + shift[1])
        canvases = []
        for draw in (base._render_road, lambda *a: type(base)._render_road(base, *a)):
            base.surf = pygame.Surface((WINDOW_W, WINDOW_H))
            draw(zoom, translation, angle)
            canvases.append(pygame.surfarray.array3d(base.surf))
        np.testing.assert_array_equal(*canvases)
        near_quarter = min(angle % QUARTER, QUARTER - angle % QUARTER) < 1e-6   # pygame's epsilon
        assert (rotation(angle) is None) == near_quarter
        assert len(np.unique(canvases[0].reshape(-1, 3), axis=0)) > 2   # road and grass were drawn
    finally:
        env.close()


def test_elsewhere_carracing_draws_the_stock_way(monkeypatch):
    """Another gymnasium's drawing code (its source hash differs), or a CarRacing subclass
    that draws its own road, is left alone."""
    from gymnasium.envs.box2d.car_racing import CarRacing

    from nac_drive.simulators import road_drawing

    class OwnRoad(CarRacing):
        def _render_road(self, zoom, translation, angle):
            super()._render_road(zoom, translation, angle)

    own = road_drawing.draw_faster(OwnRoad())
    assert "_render_road" not in own.unwrapped.__dict__ and "_render" in own.unwrapped.__dict__
    own.close()
    monkeypatch.setattr(pygame, "IS_CE", False, raising=False)   # upstream pygame: a quit font may be freed
    stock_font = make_carracing()
    assert "_render" not in stock_font.unwrapped.__dict__ and "_render_road" in stock_font.unwrapped.__dict__
    stock_font.close()
    monkeypatch.undo()
    monkeypatch.setattr(road_drawing, "RENDER_SOURCE_SHA256", "0" * 64)
    stock_font = make_carracing()
    assert "_render" not in stock_font.unwrapped.__dict__ and "_render_road" in stock_font.unwrapped.__dict__
    stock_font.close()
    monkeypatch.setattr(road_drawing, "REPLICATED_SOURCE_SHA256", "0" * 64)
    road_drawing.stock_drawing_is_replicated.cache_clear()
    try:
        env = make_carracing()
        assert not road_drawing.stock_drawing_is_replicated() and "_render_road" not in env.unwrapped.__dict__
        env.close()
    finally:
        road_drawing.stock_drawing_is_replicated.cache_clear()


def test_the_score_font_is_loaded_once_and_again_after_pygame_shuts_its_fonts_down():
    """One font object draws every frame's score; after ``pygame.quit()`` (a human-mode env's
    ``close``) a new one is loaded, and the frames stay the stock env's throughout."""
    fast, stock = make_carracing(), gym.make("CarRacing-v3", continuous=False)
    stock_font = pygame.font.Font
    try:
        np.testing.assert_array_equal(fast.reset(seed=4)[0], stock.reset(seed=4)[0])
        fonts = fast.unwrapped._render.fonts

        def step_both(n):
            for _ in range(n):
                np.testing.assert_array_equal(fast.step(GAS)[0], stock.step(GAS)[0])

        step_both(30)   # the score changes (tiles visited, time passing)
        assert len(fonts) == 1 and pygame.font.Font is stock_font   # restored between frames
        (first,) = fonts.values()
        step_both(30)
        assert next(iter(fonts.values())) is first
        pygame.quit()
        step_both(5)
        assert next(iter(fonts.values())) is not first and len(fonts) == 1
    finally:
        fast.close()
        stock.close()


def test_rgb_array_renders_match_an_unmodified_env():
    """``render()`` (what --video records) draws through the same faster code, at the video's size."""
    fast = make_carracing(render_mode="rgb_array")
    stock = gym.make("CarRacing-v3", continuous=False, render_mode="rgb_array")
    try:
        assert isinstance(fast.unwrapped._render, FontLoadedOnce)
        fast.reset(seed=6), stock.reset(seed=6)
        for _ in range(40):
            fast.step(GAS), stock.step(GAS)
        frame = fast.render()
        np.testing.assert_array_equal(frame, stock.render())
        assert frame.shape == (400, 600, 3)
    finally:
        fast.close()
        stock.close()
