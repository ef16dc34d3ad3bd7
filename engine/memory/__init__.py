"""Activation memory: the pure planner (offsets in one arena) and the arena that hands out views."""

from engine.memory.arena import Arena
from engine.memory.planner import ALIGNMENT, MemoryPlan, Step, plan

__all__ = ["ALIGNMENT", "Arena", "MemoryPlan", "Step", "plan"]
