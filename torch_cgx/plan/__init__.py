"""The planner (HiPress's SeCoPa idea): measured compute and link costs, a cost model per
algorithm, and per-gradient decisions (exact or compressed, which setting, which algorithm, how
many pipeline segments). ``python -m torch_cgx.plan`` prints a model's plan."""

from torch_cgx.plan.costs import CompressorCosts, LinkCosts, calibrate
from torch_cgx.plan.model import Option, predict
from torch_cgx.plan.planner import Budget, Plan, choose, plan_gradients, read_pins

__all__ = ["Budget", "CompressorCosts", "LinkCosts", "Option", "Plan", "calibrate", "choose",
           "plan_gradients", "predict", "read_pins"]  # fmt: skip
