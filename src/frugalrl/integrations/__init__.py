"""Adapters that let other RL libraries train on :class:`~frugalrl.ClusterEnv`.

* :mod:`frugalrl.integrations.sb3`: Stable-Baselines3 (``pip install 'frugalrl[sb3]'``):
  :class:`~frugalrl.integrations.sb3.SB3VecEnv` and
  :func:`~frugalrl.integrations.sb3.make_sb3_vec_env`.

Each adapter lives in its own module and imports its library there, so ``import frugalrl`` never
needs them.
"""
