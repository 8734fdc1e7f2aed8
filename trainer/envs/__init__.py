"""Text environments for multi-turn agent RL, behind one registry."""
from .base import ENVS, QuestionEnv, StepResult, TextEnv, env_class, make_env, parse_action
from .frozenlake import FrozenLake
from .geoqa import GeoQA
from .math import Math
from .picture_games import FrozenLakeVLM, SokobanVLM
from .search import Search
from .sokoban import Sokoban

__all__ = ["ENVS", "QuestionEnv", "StepResult", "TextEnv", "env_class", "make_env", "parse_action", "FrozenLake",
           "FrozenLakeVLM", "GeoQA", "Math", "Search", "Sokoban", "SokobanVLM"]
