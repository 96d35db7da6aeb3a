"""frugalrl's MinAtar env: minatar's own Gymnasium env step for step, without importing the minatar package."""

from __future__ import annotations

import pickle
import subprocess
import sys

import numpy as np
import pytest
from gymnasium.utils.env_checker import check_env

from frugalrl.envs.minatar import GAMES, MinAtarEnv, make_minatar

pytest.importorskip("minatar")
pytestmark = pytest.mark.timeout(120)


@pytest.mark.parametrize("game", GAMES)
@pytest.mark.parametrize("minimal", [True, False])
def test_the_same_game_as_minatars_own_env(game, minimal):
    """Same observations, rewards, ends and action sets as ``minatar.gym.BaseEnv`` for the same seeds and actions
    (sticky actions included, over episodes seeded and not)."""
    from minatar.gym import BaseEnv

    ours, theirs = MinAtarEnv(game, use_minimal_action_set=minimal), BaseEnv(game, use_minimal_action_set=minimal)
    assert ours.action_space == theirs.action_space and ours.observation_space == theirs.observation_space
    rng = np.random.default_rng(0)
    for seed in (3, None, 4):
        got, want = ours.reset(seed=seed)[0], theirs.reset(seed=seed)[0]
        np.testing.assert_array_equal(got, want)
        for _ in range(300):
            action = int(rng.integers(ours.action_space.n))
            got, want = ours.step(action), theirs.step(action)
            np.testing.assert_array_equal(got[0], want[0])
            assert got[1:4] == want[1:4]
            if got[2]:
                break


def test_no_display_libraries_in_a_process_that_plays():
    """The minatar package imports seaborn, pandas, scipy and matplotlib (its display): a process that builds and
    steps a game, through its id as a worker does, imports none of them."""
    code = ("import sys, gymnasium as gym, frugalrl.envs.minatar\n"
            "env = gym.make('MinAtar/Breakout-v1'); env.reset(seed=0); env.step(0)\n"
            "print(sorted(set(sys.modules) & {'minatar', 'seaborn', 'pandas', 'scipy', 'matplotlib'}))\n"
            "import minatar.environments.breakout\n"  # the package's own import stays as it was
            "print(minatar.environments.breakout.Env.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split() == ["[]", "minatar.environments.breakout"], out.stdout + out.stderr


@pytest.mark.filterwarnings("ignore:.*seed. function is dropped")  # BaseEnv has seed() too: kept for its users
def test_renders_and_checks():
    env = MinAtarEnv("breakout", render_mode="array")
    obs, _ = env.reset(seed=0)
    np.testing.assert_array_equal(env.render(), obs)
    frame = MinAtarEnv("breakout", render_mode="rgb_array")
    frame.reset(seed=0)
    assert frame.render().shape == (10, 10, 3)
    with pytest.raises(ValueError, match="unknown MinAtar game 'pong'"):
        make_minatar("pong")
    with pytest.raises(ValueError, match="render_mode"):
        MinAtarEnv("breakout", render_mode="rgb")
    with pytest.warns(UserWarning, match="render_mode"):  # as BaseEnv
        assert MinAtarEnv("breakout").render() is None
    check_env(make_minatar("freeway").unwrapped, skip_render_check=True)


def test_a_game_pickles_into_another_process_and_plays_on():
    """Its game's class lives in a privately named module: the env pickles as the game's name and attributes, and
    plays on in a fresh process as the original does (its random stream included)."""
    env = MinAtarEnv("seaquest", use_minimal_action_set=True)
    env.reset(seed=5)
    for action in (1, 2, 3):
        env.step(action)
    code = ("import pickle, sys\nenv = pickle.loads(sys.stdin.buffer.read())\n"
            "print([int(env.step(a)[0].sum()) for a in (0, 1, 2, 3, 4) * 4])")
    out = subprocess.run([sys.executable, "-c", code], input=pickle.dumps(env), capture_output=True, timeout=60,
                         check=True)
    assert out.stdout.decode().strip() == str([int(env.step(a)[0].sum()) for a in (0, 1, 2, 3, 4) * 4])


def test_seed_is_minatars():
    """``seed()`` as ``BaseEnv.seed``: the next unseeded reset starts from it."""
    a, b = MinAtarEnv("asterix"), MinAtarEnv("asterix")
    a.seed(7)
    b.reset(seed=7)
    np.testing.assert_array_equal(a.reset()[0], b.game.state())
    for action in (1, 2, 3, 4, 5):
        np.testing.assert_array_equal(a.step(action)[0], b.step(action)[0])

